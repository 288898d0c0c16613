from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "controlplane.core"
    label = "core"
