#!/usr/bin/env bash
# `make test` on clean clones beside a CPU hog (the bar: five runs beside a CPU hog, 0 failures;
# docs/reliability.md). Each run clones HEAD afresh (so nothing built here is reused), starts HOGS busy-looping
# processes at nice 0 for the whole run (default 1: half of this 2-core host, beside whatever else runs), runs .ci/run, and appends one line per run to the summary:
#   HOGRUN run=<n> commit=<sha> rc=<exit code> seconds=<wall> load1_max=<highest 1-min load seen> result="<pytest's last line>"
# Usage: scripts/ci_beside_hog.sh [runs (default 5)] [summary file (default var/hog/summary.txt)]
# REUSE=1 clones once and runs .ci/run there each time (the first run installs; later ones reuse its venv and
# models, as a developer's checkout does, and start from an empty var/): ~5 min less a run. Each run's log, with
# pytest's 40 slowest tests (PYTEST_ADDOPTS), is kept as <summary dir>/run-<n>.log. CLONE=<dir> goes on in a
# clone an earlier REUSE run left, FIRST=<n> numbers the runs from n. HOGS=0 starts no busy loop: for runs beside
# another CPU-bound load started by hand (say so in the record).
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-5}
SUMMARY=${2:-var/hog/summary.txt}
mkdir -p "$(dirname "$SUMMARY")"
SUMMARY=$(realpath "$SUMMARY")
HOGS=${HOGS:-1}
REUSE=${REUSE:-0}
FIRST=${FIRST:-1}
export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:---durations=40}"
clone=${CLONE:-}

for run in $(seq "$FIRST" $((FIRST + RUNS - 1))); do
    if [ "$REUSE" = 1 ] && [ -n "$clone" ]; then
        git -C "$clone" pull -q --ff-only  # this checkout's HEAD, on the venv the first run installed
        rm -rf "$clone/var" "$clone/.pytest_cache"
    else
        clone=$(mktemp -d /tmp/hogrun.XXXXXX)
        git clone -q . "$clone"
    fi
    commit=$(git -C "$clone" rev-parse --short HEAD)
    hogs=()
    for _ in $(seq 1 "$HOGS"); do  # none when HOGS=0
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
    # The suite's CPU per test (tests/plugins/cpu_ledger.py), kept as run-<n>-cpu/ (scripts/suite_cpu.py sums it).
    rm -rf "$clone/.cpu-ledger"
    (cd "$clone" && SUITE_CPU_LOG="$clone/.cpu-ledger" bash .ci/run >"$clone/ci.log" 2>&1)
    rc=$?
    seconds=$(($(date +%s) - start))
    kill "${hogs[@]}" "$watcher" 2>/dev/null
    wait "${hogs[@]}" "$watcher" 2>/dev/null
    hogs=()
    # pytest's own summary line (make lint's output now follows it in the log).
    result=$(grep -E "(passed|failed).* in [0-9.]+s" "$clone/ci.log" | tail -1)
    echo "HOGRUN run=$run commit=$commit hogs=$HOGS rc=$rc seconds=$seconds load1_max=$(cat "$clone/.load_peak" 2>/dev/null) result=\"$result\"" | tee -a "$SUMMARY"
    cp "$clone/ci.log" "$(dirname "$SUMMARY")/run-$run.log"
    rm -rf "$(dirname "$SUMMARY")/run-$run-cpu" && cp -r "$clone/.cpu-ledger" "$(dirname "$SUMMARY")/run-$run-cpu" 2>/dev/null
    if [ "$rc" -ne 0 ]; then
        mkdir -p "$(dirname "$SUMMARY")/failed-$run"
        cp -r "$clone/var" "$(dirname "$SUMMARY")/failed-$run/" 2>/dev/null
    fi
    [ "$REUSE" = 1 ] || rm -rf "$clone"
done
if [ "$REUSE" = 1 ] && [ -n "$clone" ]; then rm -rf "$clone"; fi
