from django.apps import AppConfig


class FilesConfig(AppConfig):
    name = "controlplane.files"
    label = "files"
