#!/usr/bin/env bash
# bench/kafka_release_load.sh BUILD [RUNS] [HOGS] - tests/kafka/kafka_release.sh under CPU load
# (issue 39): HOGS busy loops (default 2, the CI's load on a 2-core box) run beside RUNS runs
# (default 20) of the test; prints each run's result (the FAIL line when it fails) and the count
# of failures. Used to measure how often the test fails under load (bench/RESULTS.md).
set -uo pipefail
build=$1
runs=${2:-20}
hogs=${3:-2}
src=$(cd "$(dirname "$0")/.." && pwd)
hog_pids=()
for ((i = 0; i < hogs; i++)); do
    sh -c 'while :; do :; done' &
    hog_pids+=($!)
done
trap 'for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null; done' EXIT
fails=0
for ((i = 1; i <= runs; i++)); do
    if out=$(bash "$src/tests/kafka/kafka_release.sh" "$build" "$src" 2>&1); then
        echo "run $i: ok: $(echo "$out" | grep -E "^kafka_release: [0-9]" | sed 's/; verify.*//')"
    else
        fails=$((fails + 1))
        echo "run $i: FAIL: $(echo "$out" | grep -m1 FAIL)"
    fi
done
echo "kafka_release under $hogs busy loops: $fails of $runs runs failed"
