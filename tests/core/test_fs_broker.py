"""The embedded broker (core/messaging/fs_broker.py): kombu's filesystem transport whose message files are renamed into
place whole, and whose consumers skip an unreadable file instead of exiting."""

from __future__ import annotations

import logging
import os

import pytest
from kombu import Connection
from kombu.exceptions import ChannelError

from controlplane.core.messaging import fs_broker


@pytest.fixture
def connection(tmp_path):
    with Connection("filesystem://", transport=fs_broker.TRANSPORT) as conn:
        conn.transport_options.update(fs_broker.transport_options(tmp_path / "broker"))
        yield conn


def _queue_dir(connection) -> str:
    return connection.transport_options["data_folder_in"]


def test_messages_go_round_trip_through_kombu_in_order(connection):
    queue = connection.SimpleQueue("control")
    for n in range(50):  # many within one millisecond: their order must not be left to chance
        queue.put({"task": n})
    got = []
    for _ in range(50):
        message = queue.get(timeout=1)
        got.append(message.payload["task"])
        message.ack()
    assert got == list(range(50))
    queue.close()


def test_a_torn_message_file_is_dropped_and_the_next_one_delivered(connection, caplog):
    channel = connection.default_channel
    # What kombu's own producer leaves between creating the file and writing it (or when it is killed there).
    open(os.path.join(_queue_dir(connection), f"{0:020d}_torn.control.msg"), "wb").close()
    channel._put("control", {"after": True})
    with caplog.at_level(logging.ERROR, logger="controlplane.core.messaging.fs_broker"):
        assert channel._get("control") == {"after": True}
    assert "dropped an unreadable message file of queue control" in caplog.text
    assert os.listdir(_queue_dir(connection)) == []


def test_a_message_is_visible_only_once_whole(connection, monkeypatch):
    channel = connection.default_channel
    seen_before_rename = []
    replace = os.replace

    def watching(src, dst):
        # Just before the rename, a consumer listing the folder sees no file of the queue.
        seen_before_rename.append([name for name in os.listdir(_queue_dir(connection)) if name.endswith(".msg")])
        replace(src, dst)

    monkeypatch.setattr(os, "replace", watching)
    channel._put("control", {"whole": True})
    assert seen_before_rename == [[]]
    assert channel._get("control") == {"whole": True}


def test_a_failed_write_leaves_no_message(connection, monkeypatch):
    channel = connection.default_channel

    def disk_full(payload):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fs_broker, "dumps", disk_full)
    with pytest.raises(ChannelError, match="Cannot add file"):
        channel._put("control", {"lost": True})
    assert os.listdir(_queue_dir(connection)) == []
