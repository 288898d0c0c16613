"""Result spools (files/storage.py): on local storage the finished spool becomes the blob by a link, not a
second copy; on S3 it is uploaded. Either way the blob holds exactly what was written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controlplane.files.storage import blob_open, blob_save_spooled, blob_spool, blob_storage


def test_a_spool_becomes_its_blob(any_storage):
    name = "results/t1/batch_x_output_abcd.jsonl"
    payload = b"".join(b'{"line": %d}\n' % i for i in range(10_000))
    with blob_spool(name) as spool:
        spool.write(payload)
        local = any_storage is None
        if local:
            spooled = Path(spool.name)
            assert spooled.parent == Path(blob_storage().path(name)).parent, "beside the blob: a link, not a copy"
            inode = os.stat(spooled).st_ino
        assert blob_save_spooled(name, spool) == name
    with blob_open(name) as stored:
        assert stored.read() == payload
    if local:
        assert os.stat(blob_storage().path(name)).st_ino == inode
        assert not spooled.exists(), "the spool goes when its block ends"


def test_a_spool_never_overwrites_a_blob(any_storage):
    name = "results/t1/batch_y_output_abcd.jsonl"
    with blob_spool(name) as spool:
        spool.write(b"first\n")
        blob_save_spooled(name, spool)
    with blob_spool(name) as spool, pytest.raises((FileExistsError, RuntimeError)):
        spool.write(b"second\n")
        blob_save_spooled(name, spool)
    with blob_open(name) as stored:
        assert stored.read() == b"first\n"


def test_an_abandoned_spool_leaves_nothing_behind():
    name = "results/t1/batch_z_output_abcd.jsonl"
    with pytest.raises(ZeroDivisionError), blob_spool(name) as spool:
        spool.write(b"partial\n")
        path = Path(spool.name)
        1 / 0  # noqa: B018 - a finalizer failing halfway
    assert not path.exists() and not blob_storage().exists(name)
