"""The buffering reverse proxy in front of gunicorn (deploy/k8s/base/nginx.conf): the configuration has the slow-
client timeouts, the body size limit of POST /v1/files, request and response buffering and the internal download
location; compose runs it in front of web, and the web pod runs it as a sidecar behind its Service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from controlplane.files.views import _MULTIPART_SLACK
from tests.deploy.manifests import (
    NGINX_CONF,
    OVERLAYS,
    compose_file,
    find,
    nginx_directives,
    nginx_parse,
    nginx_seconds,
    nginx_size,
    render,
)


def _http() -> list[Any]:
    [http] = nginx_directives(nginx_parse(NGINX_CONF.read_text()), "http")
    return http[-1]


def _value(block: list[Any], name: str) -> str:
    [directive] = nginx_directives(block, name)
    return directive[1]


def _server(port: str = "8080") -> list[Any]:
    """The server block listening on ``port``: 8080 for tenants, 8081 for the fleet's /internal/fleet/."""
    [server] = [s for s in nginx_directives(_http(), "server") if _value(s[-1], "listen") == port]
    return server[-1]


def _locations(port: str = "8080") -> dict[str, list[Any]]:
    return {d[1]: d[-1] for d in nginx_directives(_server(port), "location")}


def internal_blob_location() -> tuple[str, str]:
    """(prefix, alias) of the internal location that FILE_DOWNLOAD_ACCEL_PREFIX names."""
    [(prefix, body)] = [(p, b) for p, b in _locations().items() if nginx_directives(b, "internal")]
    return prefix, _value(body, "alias")


def test_slow_clients_meet_timeouts():
    http = _http()
    assert nginx_seconds(_value(http, "client_header_timeout")) <= 10
    assert nginx_seconds(_value(http, "client_body_timeout")) <= 30
    assert nginx_seconds(_value(http, "send_timeout")) <= 60
    # Longer than gunicorn's --timeout (300 s, web.yaml), so nginx never cuts an answer gunicorn still gives.
    assert nginx_seconds(_value(http, "proxy_read_timeout")) > 300


def test_the_body_limit_is_file_max_bytes_with_the_multipart_slack():
    assert nginx_size(_value(_http(), "client_max_body_size")) == settings.FILE_MAX_BYTES + _MULTIPART_SLACK


def test_requests_and_answers_are_buffered_and_downloads_handed_to_nginx():
    http = _http()
    assert _value(http, "proxy_request_buffering") == "on" and _value(http, "proxy_buffering") == "on"
    assert nginx_size(_value(http, "proxy_max_temp_file_size")) >= settings.FILE_MAX_BYTES
    [upstream] = nginx_directives(http, "upstream")
    assert nginx_directives(upstream[-1], "server")[0][1] == "web:8000"
    root = _locations()["/"]
    assert _value(root, "proxy_pass") == "http://controlplane_web"
    headers = {d[1]: d[2] for d in nginx_directives(root, "proxy_set_header")}
    assert headers["X-Real-IP"] == "$remote_addr" and headers["Host"] == "$http_host"
    prefix, alias = internal_blob_location()
    assert prefix == compose_file()["services"]["web"]["environment"]["FILE_DOWNLOAD_ACCEL_PREFIX"]
    assert alias.rstrip("/") == compose_file()["x-controlplane"]["environment"]["STORAGE_ROOT"]


def test_the_tenant_server_hides_internal_and_the_fleet_server_serves_only_it():
    assert {_value(s[-1], "listen") for s in nginx_directives(_http(), "server")} == {"8080", "8081"}
    public = _locations("8080")
    assert _value(public["/internal/"], "return") == "404"
    fleet = _locations("8081")
    assert set(fleet) == {"/internal/fleet/", "/"}
    assert _value(fleet["/"], "return") == "404"
    assert _value(fleet["/internal/fleet/"], "proxy_pass") == "http://controlplane_web"


def test_a_config_without_timeouts_fails_these_checks():
    text = NGINX_CONF.read_text().replace("client_body_timeout 30s;", "")
    [http] = nginx_directives(nginx_parse(text), "http")
    assert nginx_directives(http[-1], "client_body_timeout") == []
    with pytest.raises(AssertionError):
        nginx_parse("http { server { listen 8080; }")


def _pinned(image: str) -> bool:
    name, _, tag = image.partition(":")
    return name == "nginx" and tag[:1].isdigit() and tag.count(".") == 2


def test_compose_puts_nginx_in_front_of_web():
    services = compose_file()["services"]
    nginx = services["nginx"]
    assert _pinned(nginx["image"]), nginx["image"]
    config = Path("deploy/compose") / nginx["volumes"][0].split(":")[0]
    assert (NGINX_CONF.parents[3] / config).resolve() == NGINX_CONF
    assert nginx["volumes"][0].endswith(":/etc/nginx/nginx.conf:ro")
    assert "storage:/var/lib/controlplane/storage:ro" in nginx["volumes"]
    assert nginx["ports"] == ["${WEB_PORT:-8000}:8080"] and nginx["depends_on"]["web"]["condition"] == "service_healthy"
    assert "ports" not in services["web"]  # reached through nginx only
    assert services["web"]["environment"]["ADMIN_LOGIN_CLIENT_ADDRESS_HEADER"] == "HTTP_X_REAL_IP"


def _web_pod(overlay: str) -> dict[str, Any]:
    return find(render(overlay), "Deployment", "controlplane-web")["spec"]["template"]["spec"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_web_pod_runs_nginx_in_front_of_gunicorn(overlay):
    docs = render(overlay)
    pod = _web_pod(overlay)
    web, nginx = pod["containers"]
    # The same pinned release as compose's (gpu-prod pulls it from its registry mirror).
    release = compose_file()["services"]["nginx"]["image"].partition(":")[2]
    assert nginx["name"] == "nginx" and nginx["image"].rpartition(":")[2] == release
    assert {"ip": "127.0.0.1", "hostnames": ["web"]} in pod["hostAliases"]  # the config's upstream web:8000
    assert web["ports"] == [{"name": "gunicorn", "containerPort": 8000}]
    assert {"ADMIN_LOGIN_CLIENT_ADDRESS_HEADER": "HTTP_X_REAL_IP"}.items() <= {
        e["name"]: e.get("value") for e in web["env"]
    }.items()
    # The Service sends its traffic to nginx's port.
    service = find(docs, "Service", "controlplane-web")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert {"name": "http", "containerPort": 8080} in nginx["ports"]
    # Its configuration is the shared file, through the generated ConfigMap.
    mount = next(m for m in nginx["volumeMounts"] if m["mountPath"] == "/etc/nginx/nginx.conf")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = find(docs, "ConfigMap", volume["configMap"]["name"])
    assert config_map["data"][mount["subPath"]] == NGINX_CONF.read_text()
    assert any(m["mountPath"] == "/tmp" for m in nginx["volumeMounts"])  # pid and buffers, read-only root
