#!/usr/bin/env bash
# tests/e2e/e2e_crash.sh BUILD SRC - kill -9 and named crash points, then resume (RELIABILITY.md rows 1
# and 19). A chain of runs of one job is SIGKILLed after random delays (TM_CRASH_POINTS, default
# 50, the issue's minimum; TM_CRASH_SEED picks the delays, printed for replay); after every kill
# manifest.json and metrics.json must be whole JSON; the last run finishes and the exactly-once oracle
# (tests/oracles/verify_outputs.cjs: every input record once across completions and errors, metrics
# counts equal) and lz4 -t must pass. Then each named fault point of the commit protocol
# (base/fault_io.h) ends a run at its 2nd and then its 5th pass, chained, and the job is resumed to
# the end and verified again.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$src/tests/e2e/durable_lib.sh"
dur_setup 240

points=${TM_CRASH_POINTS:-50}
seed=${TM_CRASH_SEED:-$(( $(date +%s) % 100000 ))}
echo "e2e_crash: $points kill points, seed $seed (TM_CRASH_SEED=$seed replays the delays)"
RANDOM=$seed
kills=0 finished=0
for ((k = 0; k < points; k++)); do
    # 0.2..1.2 s: start-up takes ~0.3 s, so most kills land in inference, writes and commits
    delay=$(printf '0.%03d' $((RANDOM % 1000)))
    delay=$(echo "$delay + 0.2" | bc -l)
    "$build/tokenmill" -q run "$work/job.json" >"$work/run.log" 2>&1 &
    pid=$!
    sleep "$delay"
    kill -9 "$pid" 2>/dev/null || true
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    [ "$rc" = 137 ] && kills=$((kills + 1))
    dur_check_json
    if [ "$rc" = 0 ] && grep -q "already finished\|done in" "$work/run.log"; then
        # the job ended before the kill: check it and start over for the next kill points
        dur_verify
        finished=$((finished + 1))
        dur_run --restart || true
        rm -rf "$work/out"
    elif [ "$rc" != 137 ] && [ "$rc" != 0 ]; then
        echo "FAIL: run exited $rc"; cat "$work/run.log"; exit 1
    fi
done
dur_run || { echo "FAIL: the resumed run failed"; cat "$work/run.log"; exit 1; }
dur_verify
echo "e2e_crash: $kills runs killed, $finished ended first (verified, restarted); final resume: $(cat "$work/verify.log")"

# Named points: each ends a run mid-commit, the run after it resumes.
for point in after_write_before_fsync after_fsync_before_rename after_rename_before_dirsync \
             after_commit mid_frame metrics_before_rename; do
    rm -rf "$work/out"
    n_hit=0
    passes="2 5"
    [ "$point" = metrics_before_rename ] && passes=1 # metrics.json is written once per run
    for pass in $passes; do
        rc=0
        TM_FAULT_POINT="$point:$pass" dur_run || rc=$?
        dur_check_json
        if [ "$rc" = 86 ]; then
            n_hit=$((n_hit + 1))
        elif [ "$rc" != 0 ]; then
            echo "FAIL: $point:$pass exited $rc"; cat "$work/run.log"; exit 1
        fi
        [ -f "$work/out/manifest.json.tmp" ] && [ "$point" != after_fsync_before_rename ] &&
            { echo "FAIL: manifest.json.tmp left behind at $point"; exit 1; }
    done
    dur_run || { echo "FAIL: resume after $point"; cat "$work/run.log"; exit 1; }
    dur_verify
    [ "$n_hit" -ge 1 ] || { echo "FAIL: fault point $point never reached"; exit 1; }
    echo "e2e_crash: $point: $n_hit crashes, resume ok"
done
echo "e2e_crash: ok"
