"""``/internal/fleet/...``: servers joining and leaving, for orchestrators (an init container or sidecar
registers a Triton pod, its PreStop hook drains it). Not tenant API: no API key, but the ``FLEET_TOKEN``
bearer token, compared in constant time; no token configured means the endpoints refuse everything."""

from __future__ import annotations

import hmac
import logging
import re
import time
from typing import Any

from django.conf import settings
from rest_framework import serializers
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.core.http.errors import DomainError, ValidationFailed
from controlplane.core.http.input import input_validate
from controlplane.core.messaging import dispatch
from controlplane.fleet.membership.join_leave import DrainStatus, server_drain, server_join
from controlplane.fleet.render import server_render

logger = logging.getLogger(__name__)

# A drain request waits at most this long per call (a PreStop hook calls again until 200): longer would
# hold a web worker past gunicorn's timeout.
MAX_WAIT_SECONDS = 60.0
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z"  # pod and host names: no spaces, slashes or control characters


class Unauthenticated(DomainError):
    status_code = 401
    error_type = "authentication_error"
    code = "missing_token"


class Forbidden(DomainError):
    status_code = 403
    error_type = "permission_error"
    code = "invalid_token"


class HasFleetToken(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        token = settings.FLEET_SCALING.token
        given = request.headers.get("Authorization", "")
        if not given.startswith("Bearer "):
            raise Unauthenticated("Send the fleet token as `Authorization: Bearer <FLEET_TOKEN>`.")
        if not token:
            raise Forbidden("Fleet registration is disabled: FLEET_TOKEN is not set on this service.")
        if not hmac.compare_digest(given.removeprefix("Bearer ").encode(), token.encode()):
            raise Forbidden("The fleet token is not valid.")
        return True


class ServerRegisterSerializer(serializers.Serializer[Any]):
    name = serializers.RegexField(_NAME, max_length=100)
    grpc_url = serializers.RegexField(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$", max_length=200)
    http_url = serializers.URLField(max_length=300, required=False, default="")
    metrics_url = serializers.URLField(max_length=300, required=False, default="")
    pool = serializers.RegexField(_NAME, max_length=64, required=False, default="default")
    gpu_memory_gib = serializers.ListField(
        child=serializers.FloatField(min_value=0.001, max_value=1e6), required=False, default=list, max_length=64
    )
    # An operator's override: move a server whose heartbeat is healthy to other addresses (membership.readdress_check).
    force = serializers.BooleanField(required=False, default=False)


class DrainQuerySerializer(serializers.Serializer[Any]):
    wait = serializers.FloatField(required=False, default=0.0)

    def validate_wait(self, value: float) -> float:
        if not 0 <= value <= MAX_WAIT_SECONDS:  # also refuses nan and inf
            raise serializers.ValidationError(f"a number of seconds from 0 to {MAX_WAIT_SECONDS:g}.")
        return value


class _FleetView(APIView):
    authentication_classes = ()
    permission_classes = (HasFleetToken,)
    schema = None  # not tenant API: kept out of /v1/openapi.json


class ServerRegisterView(_FleetView):
    def post(self, request: Request) -> Response:
        data = input_validate(ServerRegisterSerializer, request.data)
        server, created = server_join(
            name=data["name"],
            grpc_url=data["grpc_url"],
            http_url=data["http_url"],
            metrics_url=data["metrics_url"],
            pool=data["pool"],
            gpu_memory_bytes=[int(g * 1024**3) for g in data["gpu_memory_gib"]],
            actor="fleet_api",
            force=data["force"],
        )
        return Response(server_render(server, created=created), status=201 if created else 200)


def _reconcile_soon() -> None:
    """Move a draining server's models now rather than at beat's next reconcile (FLEET_RECONCILE_INTERVAL_SECONDS):
    a PreStop hook waits on it. One reconcile runs at a time (its lock), so repeats cost nothing; without a
    broker, beat's tick still does it."""
    # A broker failure is logged there: the drain goes on, a few seconds slower.
    dispatch.fleet_reconcile_now(actor="fleet_api:drain")


class ServerDrainView(_FleetView):
    def post(self, request: Request, name: str) -> Response:
        wait = input_validate(DrainQuerySerializer, request.query_params)["wait"]
        if not re.match(_NAME, name) or len(name) > 100:
            raise ValidationFailed("not a server name", param="name")
        deadline = time.monotonic() + wait
        status: DrainStatus = server_drain(name=name, actor="fleet_api")
        if status.placements:
            _reconcile_soon()
        while not status.drained and time.monotonic() < deadline:
            time.sleep(min(settings.FLEET_SCALING.drain_poll_s, max(0.0, deadline - time.monotonic())))
            status = server_drain(name=name, actor="fleet_api")
        return Response(status.render(), status=200 if status.drained else 202)
