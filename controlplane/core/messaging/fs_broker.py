"""The embedded defaults' broker: kombu's filesystem transport, with message files that are never read torn.

kombu's transport creates a message file under its final name and then writes it; a consumer polling the same
folder can move and read the file in between and get an empty payload. It then loses that message, and the
JSON error it raises is "unrecoverable" to Celery: the whole worker exits (tests/deploy/test_supervision.py
caught the control worker dying so). Here a producer writes under a name no consumer looks at and renames the
file into place, which is atomic within one folder; and a consumer that still meets an unreadable file (one
written by an older producer, a damaged disk) logs it and takes the next instead of exiting. A dropped task
message is what every state's deadline already covers (the outbox relay, the rescuers)."""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from pathlib import Path
from time import monotonic_ns
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

logger = logging.getLogger(__name__)

# CELERY_BROKER_TRANSPORT for a filesystem:// broker URL (kombu resolves "module:Class").
TRANSPORT = "controlplane.core.messaging.fs_broker:Transport"
_PARTIAL = ".part"  # kombu's consumers take only names ending in ".<queue>.msg"


def transport_options(broker_dir: Path) -> dict[str, Any]:
    for sub in ("queue", "processed", "control"):
        (broker_dir / sub).mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(broker_dir / "queue"),
        "data_folder_out": str(broker_dir / "queue"),
        "processed_folder": str(broker_dir / "processed"),
        "control_folder": str(broker_dir / "control"),
        "store_processed": False,
        # The filesystem transport polls; 50 ms keeps a 100-line batch well under a second end to end.
        "polling_interval": 0.05,
    }


class Channel(filesystem.Channel):
    # kombu's own bases disagree on the second parameter's name (message, payload); filesystem's is kept.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # Consumers take files in name order: nanoseconds, zero-padded, keep one producer's messages in order
        # (kombu's milliseconds left two messages of the same millisecond to their random uuids).
        name = f"{monotonic_ns():020d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + _PARTIAL
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.remove(partial)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        while True:  # ends with a message, or with kombu's Empty once no file of the queue is left
            try:
                return super()._get(queue)
            except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError: the file is already gone
                logger.error("broker: dropped an unreadable message file of queue %s: %s", queue, exc)


class Transport(filesystem.Transport):
    Channel = Channel
