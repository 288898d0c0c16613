from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "controlplane.usage"
    label = "usage"
    verbose_name = "Usage and cost"
