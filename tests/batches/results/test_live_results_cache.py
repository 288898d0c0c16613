"""The web process's cache of closed shards' rendered lines (controlplane/batches/results/part_cache.py), through
the live results API: a poll from behind reads no part it has read before and answers the same bytes; the bound
evicts the least recently used and never keeps an oversized shard; a part storage lost is asked for again; two
tenants' batches never answer from each other's entries."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.results import live, part_cache
from controlplane.batches.results.part_cache import ENTRY_OVERHEAD_BYTES, PartKey
from controlplane.files.storage import blob_delete
from tests.batches.results.test_live_results import _get, _ids, _page, batch
from tests.batches.test_dead_letters import sent
from tests.batches.test_lifecycle import _create
from tests.support.batches import embedding_line
from tests.support.fakes import FakeBackend
from tests.support.running import run_next

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def empty_cache():
    part_cache.part_cache_clear()
    yield
    part_cache.part_cache_clear()


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """The part names the live results open from storage, in order."""
    names: list[str] = []
    real_open = live.blob_open

    def counting_open(name: str):
        names.append(name)
        return real_open(name)

    monkeypatch.setattr(live, "blob_open", counting_open)
    return names


def _closed(batch: Batch) -> list[Shard]:
    return list(Shard.objects.filter(batch=batch, status=ShardStatus.SUCCEEDED).order_by("index"))


def test_a_second_poll_reads_no_part_again_and_answers_the_same_bytes(api, batch, opened):
    backend = FakeBackend()
    assert [run_next(batch.model, backend).outcome for _ in range(2)] == ["succeeded"] * 2
    parts = [shard.part_name for shard in _closed(batch)]
    first = _page(api, batch.id, "output")
    assert (_ids(first[0]), first[1]) == (["r0", "r1", "r2"], 3)
    assert opened == parts
    assert _page(api, batch.id, "output") == first
    assert opened == parts, "the second poll read no part"
    # A cursor inside a kept shard: exactly the lines after it, the same bytes as from storage.
    assert _page(api, batch.id, "output", 1)[0] == b"".join(first[0].splitlines(True)[1:])
    # The error stream is the parts' other kind: read once, then kept as well.
    errors = _page(api, batch.id, "errors")
    assert _ids(errors[0]) == ["r3"] and opened == [*parts, parts[1]]
    assert _page(api, batch.id, "errors") == errors and len(opened) == 3


def test_a_cancelled_batchs_skipped_shards_are_rendered_once(api, batch, monkeypatch):
    assert run_next(batch.model, FakeBackend()).outcome == "succeeded"
    services.batch_cancel(batch=batch)  # shards 1-4 were pending: skipped, their lines batch_cancelled errors
    rendered: list[int] = []
    real_entries = live.shard_entries

    def counting_entries(batch, shard, lost):
        rendered.append(shard.index)
        return real_entries(batch, shard, lost)

    monkeypatch.setattr(live, "shard_entries", counting_entries)
    errors = _page(api, batch.id, "errors")
    assert errors[1] == 8 and rendered == [1, 2, 3, 4]
    assert _page(api, batch.id, "errors") == errors
    assert _page(api, batch.id, "errors", 3)[0] == b"".join(errors[0].splitlines(True)[3:])
    assert rendered == [1, 2, 3, 4], "rendered once, then answered from the cache"


def test_the_bound_evicts_the_least_recently_used_first(settings):
    entry = b'{"custom_id": "x"}\n' * 50
    cost = len(entry) + ENTRY_OVERHEAD_BYTES
    settings.RESULTS_PART_CACHE_BYTES = 8 * cost  # an entry is at most an eighth: eight fit
    keys = [PartKey(f"batch_{i}", i, f"parts/batch_{i}/000000.jsonl", "succeeded", "out") for i in range(10)]
    for key in keys[:8]:
        assert part_cache.part_lines_put(key, entry)
    assert part_cache.part_cache_held_bytes() == 8 * cost
    assert part_cache.part_lines_get(keys[0]) == entry  # used now: the oldest is keys[1]
    assert part_cache.part_lines_put(keys[8], entry)
    assert part_cache.part_lines_get(keys[1]) is None
    assert all(part_cache.part_lines_get(key) == entry for key in (keys[0], *keys[2:9]))
    assert part_cache.part_cache_held_bytes() == 8 * cost
    # Larger than an eighth of the bound: not kept, and nothing is pushed out for it.
    assert not part_cache.part_lines_put(keys[9], entry + b"y" * 10 + b"\n")
    assert part_cache.part_lines_get(keys[9]) is None and part_cache.part_cache_held_bytes() == 8 * cost


def test_a_shard_larger_than_an_eighth_of_the_bound_is_read_from_storage_every_time(api, batch, opened, settings):
    backend = FakeBackend()
    assert [run_next(batch.model, backend).outcome for _ in range(2)] == ["succeeded"] * 2
    parts = [shard.part_name for shard in _closed(batch)]
    body, _, _ = _page(api, batch.id, "output")
    shard_0, shard_1 = b"".join(body.splitlines(True)[:2]), body.splitlines(True)[2]  # r0 r1 | r2 (r3 failed)
    assert len(shard_0) > len(shard_1)
    part_cache.part_cache_clear()
    settings.RESULTS_PART_CACHE_BYTES = 8 * (len(shard_1) + ENTRY_OVERHEAD_BYTES)  # shard 1 fits, shard 0 not
    opened.clear()
    assert _page(api, batch.id, "output")[0] == body
    assert _page(api, batch.id, "output")[0] == body
    assert opened == [parts[0], parts[1], parts[0]], "shard 0 read both times, shard 1 once"
    settings.RESULTS_PART_CACHE_BYTES = 0  # off: every poll reads storage
    opened.clear()
    assert _page(api, batch.id, "output")[0] == body
    assert opened == parts


def test_a_lost_part_is_not_kept_and_storage_is_asked_again(api, batch, opened):
    backend = FakeBackend()
    assert [run_next(batch.model, backend).outcome for _ in range(2)] == ["succeeded"] * 2
    parts = [shard.part_name for shard in _closed(batch)]
    blob_delete(parts[0])
    for _ in range(2):
        response = _get(api, batch.id, "output", 0)
        assert response.status_code == 200
        # Shard 0's lines are absent (finalization reports them as part_lost), shard 1's are there.
        assert _ids(b"".join(response.streaming_content)) == ["r2"]
    assert opened == [parts[0], parts[1], parts[0]], "the lost part asked for again; shard 1 kept"


def test_two_tenants_batches_never_answer_from_each_others_entries(api, batch, other_tenant, settings):
    other = _create(other_tenant, [embedding_line(f"o{i}", f"other text {i}") for i in range(10)])
    services.batch_validate(batch_id=other.id)
    other = Batch.objects.get(id=other.id)
    assert other.status == BatchStatus.IN_PROGRESS
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION=f"Bearer {other_tenant.raw_key}")
    backend = FakeBackend()
    for _ in range(10):  # both batches' first shards, whichever the fair share serves first
        if _closed(batch) and _closed(other):
            break
        run_next(batch.model, backend)
    mine, theirs = len(_closed(batch)), len(_closed(other))
    assert mine and theirs
    for _ in range(2):  # each batch's lines from storage, then from its own entries
        my_body = _page(api, batch.id, "output")[0]
        their_body = _page(stranger, other.id, "output")[0]
        assert {json.loads(line)["custom_id"][0] for line in my_body.splitlines()} == {"r"}
        assert {json.loads(line)["custom_id"][0] for line in their_body.splitlines()} == {"o"}
    kept = part_cache.part_cache_held_bytes()
    assert kept == len(my_body) + len(their_body) + (mine + theirs) * ENTRY_OVERHEAD_BYTES
    # Neither tenant reaches the other's batch, kept lines or not.
    assert _get(api, other.id, "output").status_code == 404
    assert _get(stranger, batch.id, "output").status_code == 404
