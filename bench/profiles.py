"""py-spy's collapsed stacks summarised for the benches' --profile runs (bench/hotpath.py and those built on it)."""

from __future__ import annotations

import re
from pathlib import Path


def summarise_profile(raw: Path, out: Path, top: int = 25) -> str:
    """Self time and inclusive time per function from py-spy's collapsed stacks, idle frames dropped."""
    idle = ("wait (threading.py", "select (selectors.py", "_recv_into", "poll (", "sleep", "epoll", "acquire")
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        # "func (path:line)" → "func (path)": a function's call sites count as one; process frames go.
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";") if not f.startswith("process ")]
        if not frames or any(marker in frames[-1] for marker in idle):
            continue
        samples = int(count)
        total += samples
        own[frames[-1]] = own.get(frames[-1], 0) + samples
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + samples
    lines = [f"busy samples: {total}", "", "self %   function"]
    for frame, samples in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{100 * samples / max(total, 1):5.1f}   {frame}")
    lines += ["", "incl %   function (controlplane frames)"]
    ours = [(f, s) for f, s in inclusive.items() if "controlplane" in f]
    for frame, samples in sorted(ours, key=lambda kv: -kv[1])[:top]:
        lines.append(f"{100 * samples / max(total, 1):5.1f}   {frame}")
    text = "\n".join(lines)
    out.write_text(text + "\n")
    return text
