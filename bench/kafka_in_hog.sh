#!/usr/bin/env bash
# bench/kafka_in_hog.sh BUILD [N] - test_kafka_in N times in a row (default 50) while HOGS busy
# loops (default nproc) keep every core taken, as on a loaded CI machine: the mock cluster's
# threads, the consumers' and the given-up close's destroy thread get scheduled late, which is
# where a teardown race shows (issue 32). Stops nothing on a failure: counts them. One line per
# run (rc, wall seconds, the test's last line), then a summary; the logs of failed runs are kept
# in OUT (default a new mktemp -d, printed). Exit status 1 if any run failed.
set -uo pipefail
build=$(cd "$1" && pwd)
n=${2:-50}
hogs=${HOGS:-$(nproc)}
out=${OUT:-$(mktemp -d)}
bin=$build/test_kafka_in
[ -x "$bin" ] || { echo "kafka_in_hog: no $bin" >&2; exit 2; }
hog_pids=()
stop_hogs() { for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap stop_hogs EXIT
for ((i = 0; i < hogs; i++)); do
    (while :; do :; done) &
    hog_pids+=($!)
done
echo "kafka_in_hog: $(date -u +%FT%TZ) $(git -C "$(dirname "$0")" rev-parse --short HEAD)," \
    "$n runs of $bin, $hogs busy loops, nproc $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg)," \
    "logs of failures in $out"
bad=0
for ((r = 1; r <= n; r++)); do
    t0=$(date +%s.%N)
    "$bin" >"$out/run$r.log" 2>&1
    rc=$?
    dt=$(echo "$(date +%s.%N) - $t0" | bc)
    printf 'run %2d: rc %d, %5.1f s, %s\n' "$r" "$rc" "$dt" "$(tail -1 "$out/run$r.log")"
    if [ "$rc" = 0 ]; then rm -f "$out/run$r.log"; else bad=$((bad + 1)); fi
done
echo "kafka_in_hog: $((n - bad)) of $n passed, $bad failed (load $(cut -d' ' -f1-3 /proc/loadavg))"
[ "$bad" = 0 ]
