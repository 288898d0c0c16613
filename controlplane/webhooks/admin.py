"""Webhook endpoints and deliveries for operators: register or pause an endpoint, read an endpoint's
delivery log and each delivery's attempts, redeliver (a new attempt now, same webhook-id)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from controlplane.core.audit import AuditedAdmin
from controlplane.webhooks.models import EVENT_TYPES, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from controlplane.webhooks.render import endpoint_render
from controlplane.webhooks.services import (
    deliveries_redeliver,
    webhook_endpoint_create,
    webhook_endpoint_enable,
    webhook_endpoint_update,
)
from controlplane.webhooks.urlguard import UnsafeUrl, UrlPolicy, target_resolve


class WebhookEndpointForm(forms.ModelForm):  # type: ignore[type-arg]
    event_types = forms.MultipleChoiceField(
        choices=[(t, t) for t in EVENT_TYPES], initial=list(EVENT_TYPES), widget=forms.CheckboxSelectMultiple
    )

    class Meta:
        model = WebhookEndpoint
        fields = ("tenant", "name", "url", "event_types", "enabled")

    def clean_url(self) -> str:
        url = self.cleaned_data["url"]
        try:  # the API's check, so the form shows the reason next to the field
            target_resolve(url, policy=UrlPolicy.configured())
        except UnsafeUrl as exc:
            raise forms.ValidationError(exc.message) from exc
        return str(url)


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(AuditedAdmin, admin.ModelAdmin):  # type: ignore[type-arg]
    form = WebhookEndpointForm
    list_display = ("id", "tenant", "name", "url", "enabled", "event_types", "delivery_log", "created_at")
    list_filter = ("enabled", "tenant")
    search_fields = ("id", "url", "name", "tenant__name")
    readonly_fields = ("id", "secret_hint", "created_at", "updated_at", "delivery_log")

    @admin.display(description="signing secret")
    def secret_hint(self, endpoint: WebhookEndpoint) -> str:
        return endpoint_render(endpoint)["signing_secret_hint"] if endpoint.secret else "-"

    @admin.display(description="deliveries")
    def delivery_log(self, endpoint: WebhookEndpoint) -> str:
        url = reverse("admin:webhooks_webhookdelivery_changelist") + f"?endpoint__id__exact={endpoint.id}"
        return format_html('<a href="{}">delivery log</a>', url)

    def save_model(self, request: HttpRequest, obj: WebhookEndpoint, form: Any, change: bool) -> None:
        # Through the services, as the API: the same checks, and a generated secret.
        data = form.cleaned_data
        fields = {"url": data["url"], "name": data["name"], "event_types": list(data["event_types"])}
        if change:
            saved = webhook_endpoint_update(endpoint=WebhookEndpoint.objects.get(id=obj.id), **fields)
        else:
            saved = webhook_endpoint_create(tenant=data["tenant"], **fields)
            self.message_user(
                request,
                f"Signing secret of {saved.id} (shown only now; give it to the tenant): {saved.secret}",
                level=messages.WARNING,
            )
        saved = webhook_endpoint_enable(endpoint=saved, enabled=data["enabled"])
        obj.pk = saved.pk
        obj.refresh_from_db()


class AttemptInline(admin.TabularInline):  # type: ignore[type-arg]
    model = WebhookAttempt
    extra = 0
    can_delete = False
    fields = ("number", "started_at", "duration_ms", "status_code", "error", "response_excerpt")
    readonly_fields = fields
    ordering = ("-number",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(AuditedAdmin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "id",
        "event_type",
        "batch",
        "endpoint",
        "status",
        "attempts",
        "last_status_code",
        "next_attempt_at",
        "created_at",
    )
    list_filter = ("status", "event__type", "endpoint__tenant")
    search_fields = ("id", "event__id", "event__object_id", "endpoint__id", "endpoint__url")
    list_select_related = ("event", "endpoint")
    readonly_fields = (*(f.name for f in WebhookDelivery._meta.fields), "body")
    inlines = (AttemptInline,)
    actions = ("redeliver",)

    @admin.display(description="event", ordering="event__type")
    def event_type(self, delivery: WebhookDelivery) -> str:
        return delivery.event.type

    @admin.display(description="batch", ordering="event__object_id")
    def batch(self, delivery: WebhookDelivery) -> str:
        return delivery.event.object_id

    @admin.display(description="body sent")
    def body(self, delivery: WebhookDelivery) -> str:
        return delivery.event.body

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # deliveries come from batch events only

    @admin.action(description="Redeliver now (same webhook-id, a new 24 h retry window)")
    def redeliver(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        count = deliveries_redeliver(delivery_ids=list(queryset.values_list("id", flat=True)))
        self.message_user(request, f"{count} deliver(y/ies) queued for a new attempt.")
