#!/usr/bin/env bash
# tests/e2e/e2e_signals.sh BUILD SRC - graceful stop of file jobs (issue 24 #8, base/stop.h), with
# real processes:
#   - SIGTERM mid-run: exit 143, the summary says it stopped, metrics.json and the manifest are
#     written (not finished); the rerun finishes and every record is answered exactly once;
#   - SIGINT mid-run: exit 130, same checks;
#   - two signals: the second kills at once; the rerun still gives exactly-once outputs;
#   - a stdin job waiting on a silent pipe stops at SIGTERM (exit 143) instead of hanging.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$src/tests/e2e/durable_lib.sh"
dur_setup 300
out="$work/out"
fail() { echo "FAIL: $*"; cat "$work/run.log"; exit 1; }
start() { # ARGS...: tokenmill in the background; pid in $pid; waits for the first commit
    "$build/tokenmill" -q run "$@" "$work/job.json" >"$work/run.log" 2>&1 &
    pid=$!
    for _ in $(seq 500); do
        [ -f "$out/manifest.json" ] && return 0
        sleep 0.01
    done
    fail "no commit within 5 s"
}
not_finished() {
    node -e 'const m = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
             process.exit(m.records.finished ? 1 : 0)' "$out/manifest.json"
}

for sig in TERM INT; do
    rm -rf "$out"
    start
    kill -s "$sig" "$pid"
    rc=0
    wait "$pid" || rc=$?
    want=143
    [ "$sig" = INT ] && want=130
    [ "$rc" = "$want" ] || fail "SIG$sig: want exit $want, got $rc"
    grep -q "stopped by signal" "$work/run.log" || fail "SIG$sig: no stop summary"
    [ -f "$out/metrics.json" ] || fail "SIG$sig: no metrics.json"
    dur_check_json
    not_finished || fail "SIG$sig: the job stopped early but its manifest says finished"
    dur_run || fail "SIG$sig: the rerun failed"
    dur_verify
    echo "e2e_signals: SIG$sig -> exit $rc, rerun: $(cat "$work/verify.log")"
done

# Two signals: the first starts the graceful stop, the second kills.
rm -rf "$out"
start
kill -TERM "$pid"
kill -TERM "$pid" 2>/dev/null || true
rc=0
wait "$pid" || rc=$?
[ "$rc" = 143 ] || fail "two SIGTERMs: exit $rc"
dur_check_json
dur_run || fail "rerun after two signals"
dur_verify
echo "e2e_signals: two SIGTERMs -> exit $rc, rerun: $(cat "$work/verify.log")"

# A stdin job whose writer is silent: SIGTERM ends it.
cp "$work/job.json" "$work/job.files"
sed -i 's|"files": \["data/in.jsonl"\]|"files": ["-"]|' "$work/job.json"
rm -rf "$out"
fifo="$work/fifo"
mkfifo "$fifo"
sleep 30 >"$fifo" & # holds the pipe open, writes nothing
writer=$!
"$build/tokenmill" -q run "$work/job.json" <"$fifo" >"$work/run.log" 2>&1 &
pid=$!
sleep 0.5
kill -TERM "$pid"
for _ in $(seq 300); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
done
kill -0 "$pid" 2>/dev/null && { kill -9 "$pid"; kill "$writer"; fail "stdin job hangs after SIGTERM"; }
rc=0
wait "$pid" || rc=$?
kill "$writer" 2>/dev/null || true
wait "$writer" 2>/dev/null || true
[ "$rc" = 143 ] || fail "stdin job: exit $rc"
echo "e2e_signals: a stdin job on a silent pipe stops at SIGTERM (exit $rc)"
cp "$work/job.files" "$work/job.json"
