"""Shared model helpers."""

from __future__ import annotations

import secrets

from django.db import models


def new_public_id(prefix: str) -> str:
    """OpenAI-style opaque ids (``file-…``, ``batch_…``): random, so ids reveal nothing across tenants."""
    return f"{prefix}{secrets.token_hex(12)}"


class TimestampedModel(models.Model):
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True
