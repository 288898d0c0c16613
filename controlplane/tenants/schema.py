"""The API-key scheme in the OpenAPI description: drf-spectacular finds it by ``target_class`` once this
module is imported (TenantsConfig.ready)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "controlplane.tenants.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "`Authorization: Bearer <api key>`; keys come from `manage.py tenant_create` or "
            "`api_key_create` (the openai SDK sends its `api_key` this way).",
        }
