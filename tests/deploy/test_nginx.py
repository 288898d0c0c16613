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
    nginx_exact_location,
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
    [(prefix, body)] = [
        (p, b) for p, b in _locations().items() if nginx_directives(b, "internal") and nginx_directives(b, "alias")
    ]
    return prefix, _value(body, "alias")


def test_slow_clients_meet_timeouts():
    http = _http()
    assert nginx_seconds(_value(http, "client_header_timeout")) <= 10
    assert nginx_seconds(_value(http, "client_body_timeout")) <= 30
    assert nginx_seconds(_value(http, "send_timeout")) <= 60
    # Longer than gunicorn's --timeout (300 s, web.yaml), so nginx never cuts an answer gunicorn still gives.
    assert nginx_seconds(_value(http, "proxy_read_timeout")) > 300


def test_bodies_are_small_everywhere_but_uploads_whose_key_is_checked_first():
    small = nginx_size(_value(_http(), "client_max_body_size"))
    assert small >= settings.API_MAX_JSON_BYTES and small >= settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert small * 100 < settings.FILE_MAX_BYTES
    upload = _upload_location()
    assert nginx_size(_value(upload, "client_max_body_size")) == settings.FILE_MAX_BYTES + _MULTIPART_SLACK
    assert _value(upload, "auth_request") == "/_edge/auth"
    auth = nginx_exact_location(_server(), "/_edge/auth")
    assert nginx_directives(auth, "internal") and _value(auth, "proxy_pass").endswith("/internal/edge/auth")
    assert _value(auth, "proxy_pass_request_body") == "off"


def _upload_location() -> list[Any]:
    return nginx_exact_location(_server(), "/v1/files")


def _limits(block: list[Any]) -> dict[str, str]:
    return {d[1]: d[2] for d in nginx_directives(block, "limit_conn")}


def test_connections_and_requests_are_limited_per_client_and_uploads_in_all():
    http, server, upload = _http(), _server(), _upload_location()
    zones = {d[2].split("=")[1].split(":")[0]: d for d in nginx_directives(http, "limit_conn_zone")}
    assert zones["per_client"][1] == "$binary_remote_addr"
    assert _value(http, "limit_conn_status") == "429" and _value(http, "limit_req_status") == "429"
    assert int(_limits(server)["per_client"]) <= 64
    [request_limit] = nginx_directives(server, "limit_req")
    assert request_limit[1] == "zone=requests_per_client"
    # A location with limit_conn of its own inherits none: the upload location repeats the per-client one.
    assert _limits(upload)["per_client"] == _limits(server)["per_client"]
    assert int(_limits(upload)["uploads_per_client"]) <= 2 <= int(_limits(upload)["uploads_total"])


def _temp_budget() -> int:
    """The most the temporary directory holds: every upload allowed at once at its largest, and 16 answers
    buffered to their limit."""
    http, upload = _http(), _upload_location()
    uploads = int(_limits(upload)["uploads_total"]) * nginx_size(_value(upload, "client_max_body_size"))
    return uploads + 16 * nginx_size(_value(http, "proxy_max_temp_file_size"))


def test_requests_and_answers_are_buffered_in_bounded_space_and_downloads_handed_to_nginx():
    http = _http()
    assert _value(http, "proxy_request_buffering") == "on" and _value(http, "proxy_buffering") == "on"
    assert 0 < nginx_size(_value(http, "proxy_max_temp_file_size")) <= 256 * 1024**2
    [upstream] = nginx_directives(http, "upstream")
    assert nginx_directives(upstream[-1], "server")[0][1] == "web:8000"
    root = _locations()["/"]
    assert _value(root, "proxy_pass") == "http://controlplane_web"
    headers = {d[1]: d[2] for d in nginx_directives(_server(), "proxy_set_header")}
    assert headers["X-Real-IP"] == "$remote_addr" and headers["Host"] == "$http_host"
    assert not nginx_directives(root, "proxy_set_header")  # else the server's would not be inherited
    prefix, alias = internal_blob_location()
    assert prefix == compose_file()["services"]["web"]["environment"]["FILE_DOWNLOAD_ACCEL_PREFIX"]
    assert alias.rstrip("/") == compose_file()["x-controlplane"]["environment"]["STORAGE_ROOT"]
    # compose's tmpfs holds the whole budget (a full tmpfs would fail uploads that nginx let in).
    [tmp] = compose_file()["services"]["nginx"]["tmpfs"]
    assert tmp.startswith("/tmp:size=") and nginx_size(tmp.split("=")[1]) >= _temp_budget()


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
    assert "./trusted-proxies:/etc/nginx/trusted-proxies:ro" in nginx["volumes"]
    assert Path("deploy/compose/trusted-proxies").is_dir()  # mounted even when no proxy is named
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
    # Its temporary directory holds nginx's whole budget: a full emptyDir would get the pod evicted.
    tmp = next(m for m in nginx["volumeMounts"] if m["mountPath"] == "/tmp")
    [size] = [v["emptyDir"]["sizeLimit"] for v in pod["volumes"] if v["name"] == tmp["name"]]
    assert size.endswith("Gi") and int(size[:-2]) * 1024**3 >= _temp_budget()
    # The proxies it believes come from their own ConfigMap, at the path nginx.conf includes.
    trusted = next(m for m in nginx["volumeMounts"] if m["mountPath"] == "/etc/nginx/trusted-proxies")
    [source] = [v["configMap"]["name"] for v in pod["volumes"] if v["name"] == trusted["name"]]
    assert "trusted-proxies.conf" in find(docs, "ConfigMap", source)["data"]
    assert ["include", "/etc/nginx/trusted-proxies/*.conf"] in _http()
