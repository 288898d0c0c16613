"""Streaming a batch's output and error files to disk: memory stays flat whatever their size, and a
file appears under its final name only once it is whole."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types import Batch


# Bytes per write: large enough for few syscalls, small enough to stay flat in memory.
CHUNK_BYTES = 1024 * 1024


def result_paths(batch_id: str, output_dir: Path) -> dict[str, Path]:
    return {
        "output": output_dir / f"{batch_id}_output.jsonl",
        "errors": output_dir / f"{batch_id}_errors.jsonl",
    }


def file_download(client: OpenAI, file_id: str, path: Path) -> int:
    """Stream ``file_id``'s content into ``path`` (via a temporary name beside it); returns the bytes."""
    partial = path.with_name(path.name + ".partial")
    written = 0
    try:
        with client.files.with_streaming_response.content(file_id) as response, partial.open("wb") as sink:
            for chunk in response.iter_bytes(CHUNK_BYTES):
                sink.write(chunk)
                written += len(chunk)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return written


def results_download(client: OpenAI, batch: Batch, output_dir: Path) -> list[tuple[str, Path, int]]:
    """Download whichever of the output and error files the batch has: (kind, path, bytes) each."""
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = result_paths(batch.id, output_dir)
    done = []
    for kind, file_id in (("output", batch.output_file_id), ("errors", batch.error_file_id)):
        if file_id:
            done.append((kind, paths[kind], file_download(client, file_id, paths[kind])))
    return done
