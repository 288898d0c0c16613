"""drf-spectacular's settings for the tenant API's OpenAPI schema (no environment in them)."""

from __future__ import annotations

# The OpenAPI description of the tenant API (each app's schema.py). Public, like OpenAI's published spec:
# it describes the API, not a tenant's data, so the schema and the docs page need no key.
SPECTACULAR_SETTINGS = {
    "TITLE": "Batch inference API",
    "DESCRIPTION": "OpenAI Batch API compatible: upload a JSONL file, create a batch, download its output "
    "and error files. Authenticate with `Authorization: Bearer <api key>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_AUTHENTICATION": [],
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SCHEMA_PATH_PREFIX": "/v1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"persistAuthorization": True},
    # Enums stay inline, as in OpenAI's own spec (drf-spectacular's enum hook is left out: one-value sets like
    # `object: "file"` would become colliding components). The apps' hooks add the OpenAPI links.
    "POSTPROCESSING_HOOKS": ["controlplane.files.schema.openapi_links", "controlplane.batches.schema.openapi_links"],
    "ENUM_GENERATE_CHOICE_DESCRIPTION": False,
    # Request bodies get their own components, so the upload's `file` is described as binary.
    "COMPONENT_SPLIT_REQUEST": True,
}
