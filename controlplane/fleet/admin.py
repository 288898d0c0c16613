from __future__ import annotations

from django.contrib import admin

from controlplane.fleet.models import CatalogueModel


@admin.register(CatalogueModel)
class CatalogueModelAdmin(admin.ModelAdmin):
    list_display = ("name", "triton_name", "kind", "max_batch_size", "embedding_dimensions", "is_enabled")
    list_filter = ("kind", "is_enabled")
    search_fields = ("name", "triton_name")
