"""Summarise a suite's CPU ledger (tests/plugins/cpu_ledger.py, ``SUITE_CPU_LOG=<dir>``): CPU seconds by module and
by xdist group, the largest first, beside their wall seconds. Usage: python scripts/suite_cpu.py DIR [top]."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(directory: str, top: int = 40) -> None:
    from tests.plugins.scheduling import test_group

    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            module = record["test"].split("::")[0]
            cpu = record["own_cpu_s"] + record["children_cpu_s"]
            entry = modules[module]
            entry[0] += cpu
            entry[1] += record["children_cpu_s"]
            entry[2] += record["wall_s"]
            entry[3] += 1
            group = groups[test_group(record["test"]) or "(spread)"]
            group[0] += cpu
            group[1] += record["wall_s"]
            group[2] += 1
    total = sum(entry[0] for entry in modules.values())
    print(f"{'group':<12} {'tests':>6} {'cpu s':>8} {'wall s':>8}")
    for name, (cpu, wall, count) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:<12} {count:>6} {cpu:>8.1f} {wall:>8.1f}")
    print(f"\n{'module':<60} {'tests':>5} {'cpu s':>7} {'of it children':>14} {'wall s':>7} {'share':>6}")
    for module, (cpu, children, wall, count) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{module:<60} {count:>5} {cpu:>7.1f} {children:>14.1f} {wall:>7.1f} {cpu / total:>6.1%}")
    print(f"SUITE_CPU tests={sum(e[3] for e in modules.values())} cpu_s={total:.1f}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
