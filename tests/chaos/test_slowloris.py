"""Slowloris against the proxy: the chaos stack with the shipped nginx.conf in front of its
gunicorn (deploy/local/proxy.py). While a victim tenant's batch runs and the victim polls the API through nginx,
an attacker holds 200 slow connections open (full profile: 1,000): half send their header one byte every few
seconds and reconnect when dropped, half send valid headers and then a JSON body a byte at a time before going
silent (tests/chaos/slowloris.py); then 20 clients trickle a 1 GiB upload each.

Asserted: the victim's p99 through nginx stays under the 1 s target (bounded as the tenant-abuse scenario is:
MARGIN × the target times the contention measured here, or × the victim's own quiet-phase p99 when the host is
noisier than that); nginx closes every slow connection, without an answer, within its configured
client_header_timeout (from the connection) or client_body_timeout (from the last byte), give or take the
slack; gunicorn never saw a slow client (no attacker's request id in its log, and never more connections on its
port than it has threads while they lived); the uploads past nginx's budget are answered 429 at once and the others
are read until their body timeout, unanswered; a body over the upload limit is refused by nginx with a 413 from
its headers and never reaches gunicorn; the victim's batch loses no line."""

from __future__ import annotations

import dataclasses
import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from openai import OpenAI

from deploy.local.proxy import LocalProxy
from tests.chaos.harness import FULL, MARGIN, Chaos, Figures
from tests.chaos.probe import api_probe, latency_details, quantile
from tests.chaos.slowloris import Attack, PortWatch, SlowConnection
from tests.deploy.manifests import nginx_directives, nginx_exact_location, nginx_parse, nginx_seconds, nginx_size

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

API_P99_TARGET_S = 1.0
# nginx's timers fire on time; what a connection's close may lag its timeout by is the attacker's own loop and
# the host: this target, times MARGIN and the contention, is the bound.
CLOSE_SLACK_TARGET_S = 1.0
SLOW_CLIENTS = 1000 if FULL else 200
# Clients trickling a 1 GiB upload each: past nginx's uploads budget, the rest are answered 429 at once.
UPLOAD_CLIENTS = 20
DRIP_INTERVAL_S = 2.0  # "one byte every few seconds": under both timeouts, so no single pause trips them
BODY_DRIPS = 6 if FULL else 3
VICTIM_LINES = 3000 if FULL else 1000
BASELINE_S = 20 if FULL else 10
# deploy/local/stack.py runs gunicorn with `-w 2 --threads 4`.
GUNICORN_THREADS = 8
VICTIM_REQUEST_ID = "victim-through-nginx"


@pytest.fixture
def proxy(chaos: Chaos) -> Iterator[LocalProxy]:
    stack = chaos.stack
    local = LocalProxy(
        upstream=f"127.0.0.1:{stack.web_port}", storage_root=stack.var_dir / "storage", nice=stack.control_plane_nice
    )
    try:
        yield local.start()
    finally:
        local.stop()
        # Beside the stack's own logs, which the suite keeps after the run (var/chaos/logs/).
        shutil.copy(local.log_path, stack.log_dir / "nginx.log")
        shutil.rmtree(local.directory, ignore_errors=True)


def _http_setting(proxy: LocalProxy, name: str) -> str:
    """A directive of the http block of the file nginx runs."""
    [http] = nginx_directives(nginx_parse((proxy.directory / "nginx.conf").read_text()), "http")
    [directive] = nginx_directives(http[-1], name)
    return directive[1]


def _upload_location(proxy: LocalProxy) -> list[Any]:
    """The body of the upload location (POST /v1/files) of the file nginx runs."""
    [http] = nginx_directives(nginx_parse((proxy.directory / "nginx.conf").read_text()), "http")
    return nginx_exact_location(http[-1], "/v1/files")


def _oversize_upload(proxy: LocalProxy, api_key: str) -> bytes:
    """Headers of an upload one byte over the proxy's limit, and what comes back before any body byte is sent."""
    [limit] = nginx_directives(_upload_location(proxy), "client_max_body_size")
    length = nginx_size(limit[1]) + 1
    head = (
        f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1:{proxy.port}\r\nAuthorization: Bearer {api_key}\r\n"
        f"X-Request-Id: oversize-through-nginx\r\nContent-Type: multipart/form-data; boundary=x\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as client:
        client.sendall(head.encode())
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    return answer


def _overshoots(connections: list[SlowConnection], kind: str, timeout_s: float) -> list[float]:
    held = [c.held_s(timeout_s) for c in connections if c.kind == kind]
    return sorted(h for h in held if h is not None)


def _summary(values: list[float]) -> dict[str, Any]:
    return (
        {"min": round(values[0], 2), "p50": round(quantile(values, 0.5), 2), "max": round(values[-1], 2)}
        if values
        else {}
    )


def test_slow_clients_are_cut_by_nginx_and_never_reach_gunicorn(chaos, proxy, recorder):
    header_timeout = nginx_seconds(_http_setting(proxy, "client_header_timeout"))
    body_timeout = nginx_seconds(_http_setting(proxy, "client_body_timeout"))
    victim_key, attacker_key = chaos.new_tenant("proxied"), chaos.new_tenant("slowloris")
    # The victim goes through nginx for everything: its upload, its batch, its polling and its downloads.
    victim = OpenAI(base_url=f"{proxy.base_url}/v1", api_key=victim_key, max_retries=0, timeout=60)
    chaos.clients["proxied"] = victim
    lines = chaos.identity_lines("proxied", VICTIM_LINES)
    batch = chaos.submit(lines, tenant="proxied")
    figures = Figures("slowloris via nginx", target_s=API_P99_TARGET_S)
    figures.sample_contention()

    victim_http = requests.Session()
    victim_http.headers.update({"Authorization": f"Bearer {victim_key}", "X-Request-Id": VICTIM_REQUEST_ID})
    stop, latencies, bad = threading.Event(), [], []
    probe = threading.Thread(
        target=api_probe, args=(victim_http, f"{proxy.base_url}/v1", batch.id, stop, latencies, bad), daemon=True
    )
    attack = Attack(
        port=proxy.port,
        api_key=attacker_key,
        header_clients=SLOW_CLIENTS // 2,
        body_clients=SLOW_CLIENTS // 2,
        drip_interval_s=DRIP_INTERVAL_S,
        body_drips=BODY_DRIPS,
        give_up_after_s=30,
    )
    # Then 20 clients trickling a 1 GiB upload each: a phase of its own, since each one's key check is a real
    # (quick) request to gunicorn, which the slow clients' phase shows never happens for them.
    uploads = dataclasses.replace(attack, header_clients=0, body_clients=0, upload_clients=UPLOAD_CLIENTS)
    with PortWatch(chaos.stack.web_port) as gunicorn:
        probe.start()
        try:
            gunicorn.phase = "quiet"
            time.sleep(BASELINE_S)  # the victim alone, its batch running: the yardstick
            quiet = len(latencies)
            gunicorn.phase = "attack"
            attack_started = time.monotonic()
            connections = attack.run(header_timeout, body_timeout)
            gunicorn.phase = "uploads"
            connections += uploads.run(header_timeout, body_timeout)
            attack_s = time.monotonic() - attack_started
            # The victim's call in flight when the attack ended counts too: a call stuck through it ends only now.
            attacked = len(latencies) + 1
            chaos.wait_for("the victim's call in flight as the attack ended", lambda: len(latencies) >= attacked, 120)
            gunicorn.phase = "after"
            oversize = _oversize_upload(proxy, attacker_key)
            chaos.wait_terminal([batch.id], timeout_s=600)
        finally:
            stop.set()
            probe.join(timeout=60)
    figures.sample_contention()

    chaos.tally(figures, batch.id, lines)
    chaos.assert_clean(figures)
    ordered, baseline = sorted(latencies[quiet:attacked]), sorted(latencies[:quiet])
    p50, p99 = quantile(ordered, 0.5), quantile(ordered, 0.99)
    header_late = _overshoots(connections, "header", header_timeout)
    body_late = _overshoots(connections, "body", body_timeout)
    web_log = (chaos.stack.log_dir / "web.log").read_text(errors="replace")
    access_log = proxy.log_path.read_text(errors="replace")
    kinds = dict(Counter(c.kind for c in connections))  # a plain dict: asdict() rebuilds a Counter from its pairs
    figures.recovery_s = p99
    figures.details.update(
        {
            "slow_connections": kinds,
            "attack_s": round(attack_s, 1),
            "header_timeout_s": header_timeout,
            "header_closed_past_timeout_s": _summary(header_late),
            "body_timeout_s": body_timeout,
            "body_closed_past_timeout_s": _summary(body_late),
            "nginx_408": access_log.count('" 408 '),
            "gunicorn_connections_peak": gunicorn.peaks,
            **latency_details(ordered, baseline),
            "oversize_answer": oversize.split(b"\r\n", 1)[0].decode(errors="replace"),
        }
    )
    recorder.add(figures)

    assert not bad, f"the victim's API answered {Counter(bad)} through nginx"
    assert len(ordered) >= 20, "the victim's probe hardly ran"
    # Every slow connection was closed by nginx, with no answer (a timeout is not a 4xx it sends), and not before
    # its timeout: the configured timeout is what ended it, within the slack.
    still_open = [c.request_id for c in connections if c.closed is None]
    assert not still_open, f"nginx left {len(still_open)} slow connections open: {still_open[:5]}"
    answered = [(c.request_id, c.answer[:40]) for c in connections if c.answer and c.kind != "upload"]
    assert not answered, f"nginx answered slow clients: {answered[:5]}"
    # The trickled uploads: as many as the uploads budget let in were read until their body timed out, unanswered;
    # every other one was answered 429 from its headers (no temporary file, no gunicorn thread).
    budget = int(next(d[2] for d in nginx_directives(_upload_location(proxy), "limit_conn") if d[1] == "uploads_total"))
    uploads = [c for c in connections if c.kind == "upload"]
    refused = [c for c in uploads if c.answer.startswith(b"HTTP/1.1 429 ")]
    assert len(refused) >= UPLOAD_CLIENTS - budget and all(c.answer == b"" for c in uploads if c not in refused)
    assert len(body_late) == SLOW_CLIENTS // 2 and len(header_late) >= SLOW_CLIENTS // 2
    slack = CLOSE_SLACK_TARGET_S * MARGIN * figures.contention
    for kind, late in (("header", header_late), ("body", body_late)):
        assert late[0] > -0.5, f"{kind}: a slow connection was closed {-late[0]:.2f} s before its timeout"
        assert late[-1] < slack, (
            f"{kind}: a slow connection was closed {late[-1]:.2f} s past its timeout (bound {slack:.2f})"
        )
    # gunicorn never saw a slow client: none of their requests reached Django (the victim's did, so the log is
    # the right one), and its port never held more connections than it has threads, while 100+ slow ones lived.
    assert VICTIM_REQUEST_ID in web_log
    assert "slowloris-" not in web_log, "a slow client's request reached gunicorn"
    assert gunicorn.peaks["attack"] <= GUNICORN_THREADS, gunicorn.peaks
    # The upload over the limit: nginx's own 413 (in the API's error shape), from the headers, and nothing of it
    # in gunicorn's log but its key check.
    assert oversize.startswith(b"HTTP/1.1 413 ") and b'"request_too_large"' in oversize, oversize[:200]
    assert "oversize-through-nginx" not in web_log
    # The victim's latency through nginx under the attack: the target times the margin and this host's measured
    # contention, or, where the host's own noise is worse, the victim's quiet-phase p99 times the margin.
    bound = MARGIN * max(API_P99_TARGET_S * figures.contention, quantile(baseline, 0.99))
    assert p99 < bound, f"victim p99 {p99:.2f} s (p50 {p50:.2f} s), bound {bound:.2f} s"
