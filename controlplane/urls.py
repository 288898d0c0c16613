from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import path

from controlplane.batches.views import BatchCancelView, BatchDetailView, BatchListCreateView
from controlplane.files.views import FileContentView, FileDetailView, FileListCreateView


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
]
