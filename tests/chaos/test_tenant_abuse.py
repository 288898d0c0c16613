"""A hostile tenant against the real stack: while a victim tenant's batch runs and the victim
polls the API, an abuser floods uploads, sends files larger than its storage quota, multipart bodies where
only JSON is parsed, files of malformed lines, more batches than its quota allows, a cancel storm and a rerun
loop over its own batches, and guesses the victim's batch and file ids.

Asserted: the victim's API answers with p99 under the 1 s target (the bound is MARGIN × it × the contention
sampled around the abuse, as for the other scenarios on this shared 2-core host, or MARGIN × the victim's own p99
in a quiet phase measured just before, when the host is noisier than that; both figures go to docs/reliability.md), its batch completes with every
line exactly once, the abuser gets a 4xx for each refusal and never a 5xx, and no answer to the abuser holds
any of the victim's ids or data. `make chaos` (CHAOS_FULL=1) runs more rounds with more threads."""

from __future__ import annotations

import io
import json
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.chaos.harness import FULL, MARGIN, MODEL, Figures
from tests.chaos.probe import api_probe, latency_details, quantile
from tests.support.stack import tensor_lines

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

API_P99_TARGET_S = 1.0
ROUNDS = 6 if FULL else 2
THREADS = 8 if FULL else 4
VICTIM_LINES = 3000 if FULL else 1000
ABUSER_STORAGE_QUOTA = 2 * 1024 * 1024
ABUSER_MAX_BATCHES = 3
BASELINE_S = 20 if FULL else 10
# Rounds go on for at least this long, however quickly a host runs ROUNDS of them: on an idle quick host two rounds
# took under a second and the victim's probe got 15 samples under abuse, below the floor asserted at the end.
MIN_ABUSE_S = 5.0


class Abuser:
    """Raw HTTP as the hostile tenant, every answer kept: status counts and any body naming the victim."""

    def __init__(self, base_url: str, key: str, secrets: set[str]) -> None:
        self.base_url = base_url
        self.headers = {"Authorization": f"Bearer {key}"}
        self.secrets = secrets
        self.statuses: Counter[int] = Counter()
        self.leaks: list[str] = []
        self._lock = threading.Lock()

    def call(self, method: str, path: str, **kwargs) -> requests.Response:
        response = requests.request(method, self.base_url + path, headers=self.headers, timeout=60, **kwargs)
        body = response.text
        with self._lock:
            self.statuses[response.status_code] += 1
            # A 404 names the id it was asked for: only what the abuser did not send is a leak.
            self.leaks += [f"{method} {path}: {s}" for s in self.secrets if s in body and s not in path]
        return response

    def upload(self, content: bytes, name: str = "in.jsonl") -> requests.Response:
        return self.call("POST", "/files", files={"file": (name, io.BytesIO(content))}, data={"purpose": "batch"})

    def create(self, file_id: str) -> requests.Response:
        body = {"input_file_id": file_id, "endpoint": "/v2/infer", "completion_window": "24h"}
        return self.call("POST", "/batches", json=body)


def _jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _abuse_round(abuser: Abuser, victim_ids: list[str], rng: random.Random) -> None:
    lines = tensor_lines(20, prefix="abuse", model=MODEL)
    jobs = [
        # A file twice the whole storage quota: refused from its Content-Length, unread (413).
        lambda: abuser.upload(b"x" * (2 * ABUSER_STORAGE_QUOTA), "huge.jsonl"),
        # A flood of uploads that together overflow the quota: each a 200 or a 429.
        *[lambda: abuser.upload(b"y" * (ABUSER_STORAGE_QUOTA // 3), "flood.jsonl") for _ in range(4)],
        # Multipart where only JSON is parsed: a 4xx, never parsed to disk.
        lambda: _refused(abuser.call("POST", "/batches", files={"file": ("x", io.BytesIO(b"z" * 8 * 1024 * 1024))})),
        # Malformed lines, then a batch of them (it fails validation) and a flood of creates past the quota.
        lambda: _create_from(abuser, b'not json\n{"custom_id": 1}\n\xff\xfe\n'),
        *[lambda: _create_from(abuser, _jsonl(lines)) for _ in range(ABUSER_MAX_BATCHES + 2)],
        # A cancel storm over its own batches, and a rerun loop over them (quota-checked like a create).
        lambda: _cancel_storm(abuser),
        lambda: _rerun_loop(abuser),
        # The victim's ids and guessed ones: every door is a 404.
        *[lambda i=i: _guess(abuser, i) for i in victim_ids],
        lambda: _guess(abuser, f"batch_{rng.getrandbits(96):024x}"),
        lambda: _guess(abuser, f"file-{rng.getrandbits(96):024x}"),
    ]
    rng.shuffle(jobs)
    with ThreadPoolExecutor(THREADS) as pool:
        for future in [pool.submit(job) for job in jobs]:
            future.result()
    # Room again for the next round's flood.
    listed = abuser.call("GET", "/files?limit=100").json()["data"]
    for file in listed:
        abuser.call("DELETE", f"/files/{file['id']}")


def _refused(response: requests.Response) -> None:
    assert 400 <= response.status_code < 500, response.status_code


def _create_from(abuser: Abuser, content: bytes) -> None:
    uploaded = abuser.upload(content)
    if uploaded.status_code == 200:
        abuser.create(uploaded.json()["id"])


def _cancel_storm(abuser: Abuser) -> None:
    mine = [b["id"] for b in abuser.call("GET", "/batches?limit=20").json()["data"]]
    for _ in range(3):
        for batch_id in mine:
            abuser.call("POST", f"/batches/{batch_id}/cancel")


def _rerun_loop(abuser: Abuser) -> None:
    mine = [b["id"] for b in abuser.call("GET", "/batches?limit=20").json()["data"]]
    for batch_id in mine * 2:
        _refused_or_ok(abuser.call("POST", f"/batches/{batch_id}/rerun", json={}))


def _refused_or_ok(response: requests.Response) -> None:
    assert response.status_code < 500, response.status_code


def _guess(abuser: Abuser, object_id: str) -> None:
    prefix = "/batches" if object_id.startswith("batch") else "/files"
    doors = [("GET", f"{prefix}/{object_id}")]
    if prefix == "/batches":
        doors += [("POST", f"/batches/{object_id}/cancel"), ("POST", f"/batches/{object_id}/rerun")]
    else:
        doors += [("GET", f"/files/{object_id}/content"), ("DELETE", f"/files/{object_id}")]
    for method, path in doors:
        status = abuser.call(method, path).status_code
        assert status == 404, f"{method} {path} answered the abuser {status}"


def test_a_hostile_tenant_cannot_slow_or_see_another(chaos, recorder):
    victim_key, abuser_key = chaos.new_tenant("victim"), chaos.new_tenant("abuser")
    chaos.tenant_update(
        "abuser", "storage_quota_bytes=%s, max_concurrent_batches=%s", ABUSER_STORAGE_QUOTA, ABUSER_MAX_BATCHES
    )
    victim_sdk = chaos.sdk(victim_key)
    chaos.clients["victim"] = victim_sdk
    lines = chaos.identity_lines("victim", VICTIM_LINES)
    batch = chaos.submit(lines, tenant="victim")
    victim_ids = [batch.id, batch.input_file_id]
    figures = Figures("tenant abuse", target_s=API_P99_TARGET_S)
    figures.sample_contention()

    victim_http = requests.Session()  # the probe's one thread: a session of its own, kept alive
    victim_http.headers["Authorization"] = f"Bearer {victim_key}"
    abuser = Abuser(chaos.base_url, abuser_key, set(victim_ids) | {"victim-00000"})
    stop, latencies, bad, calls = threading.Event(), [], [], []
    probe = threading.Thread(
        target=api_probe, args=(victim_http, chaos.base_url, batch.id, stop, latencies, bad, calls), daemon=True
    )
    probe.start()
    rng = random.Random(21)
    try:
        time.sleep(BASELINE_S)  # the victim's latency with its batch running and nobody abusing: the yardstick
        quiet = len(latencies)
        rounds, abuse_started = 0, time.monotonic()
        while rounds < ROUNDS or time.monotonic() - abuse_started < MIN_ABUSE_S:
            _abuse_round(abuser, victim_ids, rng)
            rounds += 1
        chaos.wait_terminal([batch.id], timeout_s=600)
        # The victim's results exist now: guessing them is a 404 too.
        output_id = victim_sdk.batches.retrieve(batch.id).output_file_id
        assert output_id is not None
        abuser.secrets.add(output_id)
        _guess(abuser, output_id)
    finally:
        stop.set()
        probe.join(timeout=30)
    figures.sample_contention()

    chaos.tally(figures, batch.id, lines)
    chaos.assert_clean(figures)
    ordered, baseline = sorted(latencies[quiet:]), sorted(latencies[:quiet])
    p50, p99 = quantile(ordered, 0.5), quantile(ordered, 0.99)
    figures.recovery_s = p99
    figures.details.update(
        {
            **latency_details(ordered, baseline),
            "abuser_statuses": dict(sorted(abuser.statuses.items())),
            "rounds": rounds,
            "threads": THREADS,
        }
    )
    recorder.add(figures)
    assert not bad, f"the victim's API answered {Counter(bad)}"
    assert not abuser.leaks, abuser.leaks
    assert not [s for s in abuser.statuses if s >= 500], abuser.statuses
    # Each kind of refusal happened: the storage quota (413 alone, 429 beside the others; the batch quota 429
    # too) and the ownership checks (404).
    assert {404, 413, 429} <= set(abuser.statuses), abuser.statuses
    assert len(ordered) >= 20, "the victim's probe hardly ran"
    # The 1 s target times the suite's margin and the contention sampled before and after the abuse, as every chaos
    # bound (the rest of `make test` shares the two cores); on a host whose own noise is already worse (the quiet
    # baseline's p99, measured side by side before the abuse), that noise times the margin instead.
    bound = MARGIN * max(API_P99_TARGET_S * figures.contention, quantile(baseline, 0.99))
    slowest = ", ".join(f"{path} {seconds:.2f} s from {at} UTC" for seconds, path, at in sorted(calls)[-3:])
    assert p99 < bound, f"victim p99 {p99:.2f} s (p50 {p50:.2f} s), bound {bound:.2f} s; slowest: {slowest}"
