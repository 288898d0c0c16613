from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import path, re_path

from controlplane.batches.views import BatchCancelView, BatchDetailView, BatchListCreateView, BatchRerunView
from controlplane.files.views import FileContentView, FileDetailView, FileListCreateView
from controlplane.fleet.views import ModelDetailView, ModelListView


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz),
    path("v1/files", FileListCreateView.as_view()),
    path("v1/files/<str:file_id>", FileDetailView.as_view()),
    path("v1/files/<str:file_id>/content", FileContentView.as_view()),
    path("v1/batches", BatchListCreateView.as_view()),
    path("v1/batches/<str:batch_id>", BatchDetailView.as_view()),
    path("v1/batches/<str:batch_id>/cancel", BatchCancelView.as_view()),
    path("v1/batches/<str:batch_id>/rerun", BatchRerunView.as_view()),
    path("v1/models", ModelListView.as_view()),
    # path: catalogue names may hold a slash ("org/model"), as Hugging Face ids do.
    path("v1/models/<path:model_id>", ModelDetailView.as_view()),
]

if settings.SERVE_STATIC:
    # The local stack has no web server in front of gunicorn; serve the admin's CSS/JS from the apps.
    # Production sets SERVE_STATIC=0 and serves `collectstatic` output from its ingress or a CDN.
    from django.contrib.staticfiles.views import serve as static_serve

    urlpatterns += [re_path(r"^static/(?P<path>.*)$", static_serve, {"insecure": True})]
