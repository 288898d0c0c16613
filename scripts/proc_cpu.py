"""Every process's CPU on this host while something runs, summed by what the process is (docs/performance.md,
"The test suite"): the suite's CPU ledger (tests/plugins/cpu_ledger.py) sees only what pytest reaps, not
Postgres, Redis, the kernel or a stack's processes by kind. Reads /proc every 2 s and keeps each process's last
user + system time less what it had used when first seen in the first pass (processes older than the run
count from then); a process living under 2 s is missed or counted under "other". Rewrites OUT (JSON, [label,
cpu_s] pairs, largest first) after each pass.

Usage: python scripts/proc_cpu.py OUT SECONDS &   (then run the suite; stops after SECONDS)
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter

_TICK = os.sysconf("SC_CLK_TCK")
# Labels by a piece of the command line, first match wins.
_KINDS = ("postgres", "tritonserver", "triton_python_backend_stub", "redis-server", "beam.smp", "nginx", "chrom")
_CELERY_QUEUES = ("-Q shards", "-Q control", "-Q validation", "-Q housekeeping", "-Q webhooks", "beat")


def label(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    for kind in _KINDS:
        if kind in command:
            return kind
    if "exec(eval(sys.stdin.readline" in command:
        return "pytest-xdist worker"
    if "celery" in command:
        return "celery " + next((q for q in _CELERY_QUEUES if q in command), "other")
    if "gunicorn" in command:
        return "gunicorn"
    if "manage.py" in command:
        return "manage.py " + command.split("manage.py", 1)[1].split()[0]
    return "other: " + command[:60] if command else "other (kernel thread or exited)"


def main(out: str, seconds: float) -> None:
    seen: dict[tuple[str, str], list] = {}  # (pid, start time) -> [label, cpu s, cpu s before the run]
    end, first = time.monotonic() + seconds, True
    while time.monotonic() < end:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            cpu, key = (int(fields[11]) + int(fields[12])) / _TICK, (pid, fields[19])
            if key in seen:
                seen[key][1] = cpu
            elif (name := label(pid)) is not None:
                seen[key] = [name, cpu, cpu if first else 0.0]
        first = False
        totals: Counter[str] = Counter()
        for name, cpu, before in seen.values():
            totals[name] += cpu - before
        with open(out, "w") as f:
            json.dump([[name, round(cpu, 1)] for name, cpu in totals.most_common()], f, indent=0)
        time.sleep(2)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
