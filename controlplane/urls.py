from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import path, re_path
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerView

from controlplane.batches.views import (
    BatchCancelView,
    BatchDetailView,
    BatchErrorsView,
    BatchListCreateView,
    BatchOutputView,
    BatchRerunView,
)
from controlplane.files.views import FileContentView, FileDetailView, FileListCreateView
from controlplane.fleet.internal_views import ServerDrainView, ServerRegisterView
from controlplane.fleet.views import ModelDetailView, ModelListView
from controlplane.metrics.views import metrics_view
from controlplane.tenants.views import edge_auth
from controlplane.usage.views import CostsView, UsageCompletionsView, UsageEmbeddingsView, UsageTensorsView
from controlplane.webhooks.views import (
    WebhookDeliveryListView,
    WebhookEndpointDetailView,
    WebhookEndpointListCreateView,
    WebhookEndpointRotateSecretView,
    WebhookEndpointTestView,
    WebhookEventTypesView,
)


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz),
    # Prometheus scrape, bearer METRICS_TOKEN (404 when unset): docs/operations/metrics.md.
    path("metrics", metrics_view),
    # Servers joining and leaving the fleet, bearer FLEET_TOKEN (docs/operations/fleet.md).
    path("internal/fleet/servers", ServerRegisterView.as_view()),
    path("internal/fleet/servers/<str:name>/drain", ServerDrainView.as_view()),
    # nginx's check of an upload's API key before it reads the body (auth_request; never routed from outside).
    path("internal/edge/auth", edge_auth),
    path("v1/files", FileListCreateView.as_view()),
    path("v1/files/<str:file_id>", FileDetailView.as_view()),
    path("v1/files/<str:file_id>/content", FileContentView.as_view()),
    path("v1/batches", BatchListCreateView.as_view()),
    path("v1/batches/<str:batch_id>", BatchDetailView.as_view()),
    path("v1/batches/<str:batch_id>/cancel", BatchCancelView.as_view()),
    path("v1/batches/<str:batch_id>/rerun", BatchRerunView.as_view()),
    path("v1/batches/<str:batch_id>/output", BatchOutputView.as_view()),
    path("v1/batches/<str:batch_id>/errors", BatchErrorsView.as_view()),
    # OpenAI's webhook endpoint API (client.webhooks.* in the openai SDK); deliveries is our extension.
    path("v1/webhook_endpoints", WebhookEndpointListCreateView.as_view()),
    path("v1/webhook_endpoints/<str:endpoint_id>", WebhookEndpointDetailView.as_view()),
    path("v1/webhook_endpoints/<str:endpoint_id>/rotate_secret", WebhookEndpointRotateSecretView.as_view()),
    path("v1/webhook_endpoints/<str:endpoint_id>/test", WebhookEndpointTestView.as_view()),
    path("v1/webhook_endpoints/<str:endpoint_id>/deliveries", WebhookDeliveryListView.as_view()),
    path("v1/webhook_event_types", WebhookEventTypesView.as_view()),
    path("v1/models", ModelListView.as_view()),
    path("v1/organization/usage/embeddings", UsageEmbeddingsView.as_view()),
    path("v1/organization/usage/tensors", UsageTensorsView.as_view()),
    path("v1/organization/usage/completions", UsageCompletionsView.as_view()),
    path("v1/organization/costs", CostsView.as_view()),
    # path: catalogue names may hold a slash ("org/model"), as Hugging Face ids do.
    path("v1/models/<path:model_id>", ModelDetailView.as_view()),
    # Public: the OpenAPI description of the API above and a Swagger UI for it (assets: drf_spectacular_sidecar).
    path("v1/openapi.json", SpectacularJSONAPIView.as_view(), name="openapi-schema"),
    path("v1/docs", SpectacularSwaggerView.as_view(url_name="openapi-schema"), name="openapi-docs"),
]

# Errors outside DRF's views (no route matched, a crash in middleware) in OpenAI's shape under /v1/.
handler400 = "controlplane.core.http.error_pages.bad_request"
handler404 = "controlplane.core.http.error_pages.not_found"
handler500 = "controlplane.core.http.error_pages.server_error"

if settings.SERVE_STATIC:
    # The local stack has no web server in front of gunicorn; serve the admin's CSS/JS from the apps.
    # Production sets SERVE_STATIC=0 and serves `collectstatic` output from its ingress or a CDN.
    from django.contrib.staticfiles.views import serve as static_serve

    urlpatterns += [re_path(r"^static/(?P<path>.*)$", static_serve, {"insecure": True})]
