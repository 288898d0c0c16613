from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "controlplane.tenants"
    label = "tenants"

    def ready(self) -> None:
        # Registers the API-key scheme with drf-spectacular (an extension registers itself on import).
        from controlplane.tenants import schema  # noqa: F401
