from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "controlplane.core"
    label = "core"

    def ready(self) -> None:
        from controlplane.core.observability.logs import process_role
        from controlplane.core.observability.tracing import tracing_setup_from_settings

        # Every process that loads Django (web, workers, beat, manage) exports when an endpoint is set.
        tracing_setup_from_settings(role=process_role())
