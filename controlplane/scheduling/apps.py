from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "controlplane.scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The batch views show queue positions through a port in batches (batches/queue_info.py).
        from controlplane.batches.queue_info import queue_info_register
        from controlplane.scheduling.selectors import batches_queue_info

        queue_info_register(batches_queue_info)
