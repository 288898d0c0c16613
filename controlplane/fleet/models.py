from __future__ import annotations

from django.db import models


class ModelKind(models.TextChoices):
    EMBEDDINGS = "embeddings", "Text embeddings (/v1/embeddings)"
    TENSOR = "tensor", "Generic tensors (KServe v2 body, /v2/infer)"


class CatalogueModel(models.Model):
    """A model tenants may name in a batch, and the Triton model that serves it."""

    name = models.CharField(max_length=200, unique=True, help_text="Name tenants use in request bodies.")
    triton_name = models.CharField(max_length=200, help_text="Model name in the Triton repository.")
    kind = models.CharField(max_length=32, choices=ModelKind.choices)
    max_batch_size = models.PositiveIntegerField(help_text="Rows per Triton call (config.pbtxt).")
    # For tensor models: [{"name": "INPUT0", "datatype": "FP32", "dims": [-1]}] without the batch dim,
    # so a wrong input name, type or shape fails validation instead of reaching Triton.
    inputs = models.JSONField(default=list, blank=True)
    outputs = models.JSONField(default=list, blank=True)
    embedding_dimensions = models.PositiveIntegerField(null=True, blank=True)
    is_enabled = models.BooleanField(default=True)

    def __str__(self) -> str:
        return self.name
