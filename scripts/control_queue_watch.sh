#!/usr/bin/env bash
# Every few seconds, the length and the task names of each local stack's `validation`, `control` and
# `housekeeping` queues on the suite's Redis (tests/e2e/conftest.py: one key prefix per stack). It shows, for one,
# beat's housekeeping piling up behind a slow worker (docs/reliability.md); run it beside `make test` or a hog run.
# Usage: scripts/control_queue_watch.sh [seconds between looks (3)] [Redis databases ("14 15")] >> queues.log
set -uo pipefail
EVERY=${1:-3}
DATABASES=${2:-14 15}
while true; do
    for db in $DATABASES; do
        for key in $(for queue in validation control housekeeping; do
                         redis-cli -n "$db" --scan --pattern "stack-*:$queue"; done); do
            length=$(redis-cli -n "$db" llen "$key" 2>/dev/null)
            [ "${length:-0}" -gt 0 ] || continue
            tasks=$(redis-cli -n "$db" lrange "$key" 0 -1 | python3 -c '
import collections, json, sys
counts = collections.Counter()
for line in sys.stdin:
    try:
        counts[json.loads(line)["headers"]["task"]] += 1
    except (ValueError, KeyError, TypeError):
        pass
print(dict(counts))')
            echo "$(date +%T) db$db $key $length $tasks"
        done
    done
    sleep "$EVERY"
done
