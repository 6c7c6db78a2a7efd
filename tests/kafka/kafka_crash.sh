#!/usr/bin/env bash
# tests/kafka/kafka_crash.sh BUILD SRC - kill -9 with a Kafka input (label kafka; RELIABILITY.md row 1,
# issue 4). tools/kafka_mock runs in its own process, so it outlives the kills. 4,000 records (every
# 25th bad) in topic jobs:4; a chain of `tokenmill run` over one output folder is SIGKILLed at
# TM_CRASH_POINTS (default 10, all must land) random points after its consumer got its partitions, each run then
# resumed; the last run drains the topic and the exactly-once oracle (tests/oracles/verify_outputs.cjs with
# the topic read back per partition: file kafka:jobs/P, line offset + 1) must pass, as must lz4 -t.
# Each run joins a new consumer group, so the group has no offsets and the consumer starts at the
# earliest offset: every record an earlier run made durable is skipped only because the manifest
# lists its offset (the manifest wins where it and the group disagree, here maximally). A killed
# member stays in its group until its session times out (6 s on the mock), so reusing one group
# would cost ~9 s per kill; kafka_source.sh checks a kill within one group (committed offsets vs
# manifests) once.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
. "$src/tests/kafka/kafka_lib.bash"
. "$src/tests/e2e/durable_lib.sh"
dur_setup 10 # the tiny model
kin_mock jobs:4
kin_feed 4000

points=${TM_CRASH_POINTS:-10}
seed=${TM_CRASH_SEED:-$(( $(date +%s) % 100000 ))}
echo "kafka_crash: $points kill points, seed $seed (TM_CRASH_SEED=$seed replays the delays)"
RANDOM=$seed
kills=0
for ((k = 0; k < points; k++)); do
    kin_job "$work/job.json" "$work/out" "crash-$k"
    "$build/tokenmill" run "$work/job.json" >"$work/run.log" 2>&1 &
    pid=$!
    for _ in $(seq 150); do grep -q "assigned" "$work/run.log" && break; sleep 0.05; done
    sleep "$(printf '0.%03d' $((RANDOM % 500)))" # 0..0.5 s of work: reads, inference, commits
    kill -9 "$pid" 2>/dev/null || true
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    [ "$rc" = 137 ] && kills=$((kills + 1))
    [ "$rc" = 137 ] || [ "$rc" = 0 ] || { echo "FAIL: run exited $rc"; tail "$work/run.log"; exit 1; }
    dur_check_json
done
kin_job "$work/job.json" "$work/out" "crash-final"
"$build/tokenmill" -q run "$work/job.json" >"$work/run.log" 2>&1 ||
    { echo "FAIL: the resumed run failed"; tail "$work/run.log"; exit 1; }
[ "$kills" -ge "$points" ] || { echo "FAIL: only $kills kills landed"; exit 1; }
dur_check_json
lz4 -tq "$work/out/completions.jsonl.lz4" || { echo "FAIL: lz4 -t"; exit 1; }
kin_verify "$work/out"
if [ -d "$src/third_party/npm/node_modules/ajv" ]; then
    node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/manifest.schema.json" \
        "$work/out/manifest.json" >/dev/null || { echo "FAIL: manifest schema"; exit 1; }
fi
echo "kafka_crash: $kills runs killed; final resume: $(cat "$work/verify.log")"
echo "kafka_crash: ok"
