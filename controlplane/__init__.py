"""Batch inference control plane: Django project, Celery app and domain apps."""

from controlplane.celery import app as celery_app

__all__ = ["celery_app"]
