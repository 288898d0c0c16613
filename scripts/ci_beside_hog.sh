#!/usr/bin/env bash
# `make test` on clean clones beside a CPU hog (issue 24: "five runs of make test beside a CPU hog: 0 failures";
# docs/RELIABILITY.md). Each run clones HEAD afresh (so nothing built here is reused), starts HOGS busy-looping
# processes at nice 0 for the whole run (default 1: half of this 2-core host, beside whatever else runs), runs .ci/run, and appends one line per run to the summary:
#   HOGRUN run=<n> commit=<sha> rc=<exit code> seconds=<wall> load1_max=<highest 1-min load seen> result="<pytest's last line>"
# Usage: scripts/ci_beside_hog.sh [runs (default 5)] [summary file (default var/hog/summary.txt)]
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-5}
SUMMARY=${2:-var/hog/summary.txt}
mkdir -p "$(dirname "$SUMMARY")"
SUMMARY=$(realpath "$SUMMARY")
HOGS=${HOGS:-1}

for run in $(seq 1 "$RUNS"); do
    clone=$(mktemp -d /tmp/hogrun.XXXXXX)
    git clone -q . "$clone"
    commit=$(git -C "$clone" rev-parse --short HEAD)
    hogs=()
    for _ in $(seq 1 "$HOGS"); do
        python3 -c 'while True: pass' &
        hogs+=($!)
    done
    (
        peak=0
        while sleep 5; do
            load=$(cut -d' ' -f1 /proc/loadavg)
            peak=$(python3 -c "print(max($peak, $load))")
            echo "$peak" >"$clone/.load_peak"
        done
    ) &
    watcher=$!
    start=$(date +%s)
    (cd "$clone" && bash .ci/run >"$clone/ci.log" 2>&1)
    rc=$?
    seconds=$(($(date +%s) - start))
    kill "${hogs[@]}" "$watcher" 2>/dev/null
    wait "${hogs[@]}" "$watcher" 2>/dev/null
    result=$(grep -E "^[0-9]+ (passed|failed)|passed|failed" "$clone/ci.log" | tail -1)
    echo "HOGRUN run=$run commit=$commit hogs=$HOGS rc=$rc seconds=$seconds load1_max=$(cat "$clone/.load_peak" 2>/dev/null) result=\"$result\"" | tee -a "$SUMMARY"
    if [ "$rc" -ne 0 ]; then
        mkdir -p "$(dirname "$SUMMARY")/failed-$run"
        cp "$clone/ci.log" "$(dirname "$SUMMARY")/failed-$run/"
    fi
    rm -rf "$clone"
done
