#!/usr/bin/env bash
# tests/kafka/kafka_source.sh BUILD SRC - the Kafka source (input.kafka) on the mock cluster (label kafka;
# issue 3; RELIABILITY.md rows 6-8):
#   1. two consumers, one group: 10,000 records (every 25th bad) keyed "k<n>" with a header in
#      topic jobs:4 on 3 brokers. Consumer A (drain mode, folder a) starts; once it has its
#      partitions and has worked ~1 s, consumer B (same group, folder b) joins, and once B has
#      its partitions (the rebalance took some from A), broker 1 goes down for TM_KAFKA_DOWN_S
#      (default 10) seconds while both drain. (B joins before the outage on purpose: a drain-mode
#      start reads every partition's high watermark, which waits for a down broker, and under
#      load A could finish everything before a B started during the outage got any partition.)
#      Both must exit 0; every record is answered exactly once within each folder
#      and at least once across both: the union, with a record found in both folders kept once,
#      passes the exactly-once oracle (tests/oracles/verify_outputs.cjs over the merged folders, inputs =
#      the topic read back per partition). Records in both folders come from the rebalance (the
#      mock refuses the revoking consumer's last commit, see below); they are counted and
#      bounded; a record the source thread held (waiting for room in the runner's queue) when its
#      partition was revoked is dropped, not answered (counted from the logs). Both consumers did
#      work, the group's committed offsets are never ahead of the manifests (they may lag when
#      both consumers leave at once: the last commits then meet a rebalance; lagging is the safe
#      side), and an output
#      record carries its "source" (topic, partition, offset, key, headers).
#   2. committed offsets never run ahead of durable output: a third run (group g2, folder c, topic
#      jobs2 with 3,000 records) is
#      killed with SIGKILL mid-drain; every offset below g2's committed offsets must be done in
#      c's manifest. The job then resumes in follow mode and gets SIGTERM once every record is in
#      the manifest: it must drain gracefully (exit 0) and pass the oracle.
# Not covered by the mock: SSL/SASL, real log compaction, aborted-transaction markers in the input.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
. "$src/tests/kafka/kafka_lib.bash"
. "$src/tests/e2e/durable_lib.sh"
dur_setup 10 # the tiny model
kin_mock jobs:4 jobs2:4
kin_feed 10000
down_s=${TM_KAFKA_DOWN_S:-10}
wait_for() { # FILE PATTERN TENTHS
    for _ in $(seq "$3"); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "FAIL: no '$2' in $1"; tail "$1"; exit 1
}

# 1. two consumers, a broker down, a rebalance
kin_job "$work/a.json" "$work/a" g1
kin_job "$work/b.json" "$work/b" g1
t0=$(date +%s)
"$build/tokenmill" run "$work/a.json" >"$work/a.log" 2>&1 &
pid_a=$!; pids+=("$pid_a")
wait_for "$work/a.log" assigned 200
sleep 1
"$build/tokenmill" run "$work/b.json" >"$work/b.log" 2>&1 &
pid_b=$!; pids+=("$pid_b")
wait_for "$work/b.log" assigned 300
echo "down 1" >&3
sleep "$down_s"
echo "up 1" >&3
rc_a=0 rc_b=0
wait "$pid_a" || rc_a=$?
wait "$pid_b" || rc_b=$?
[ "$rc_a" = 0 ] && [ "$rc_b" = 0 ] || { echo "FAIL: exit codes $rc_a $rc_b"; tail "$work/a.log" "$work/b.log"; exit 1; }
n_a=$(node -e 'console.log(require(process.argv[1]).records.ok)' "$work/a/metrics.json")
n_b=$(node -e 'console.log(require(process.argv[1]).records.ok)' "$work/b/metrics.json")
[ "$n_a" -gt 0 ] && [ "$n_b" -gt 0 ] || { echo "FAIL: a consumer did nothing ($n_a, $n_b)"; tail "$work/b.log"; exit 1; }
kin_merge --dedupe "$work/a" "$work/b"
kin_verify "$work/merged"
# Why copies, and why not zero (librdkafka 2.0.2's mock, src/rdkafka_mock_cgrp.c and
# rdkafka_mock_handlers.c at tag v2.0.2; issue 3):
# - Eager (the default): A learns of the rebalance from a heartbeat answered REBALANCE_IN_PROGRESS,
#   i.e. once the mock group is JOINING; its revoke callback then commits, and
#   rd_kafka_mock_cgrp_check_state refuses every OffsetCommit in JOINING and SYNCING
#   (REBALANCE_IN_PROGRESS) until the new generation is UP, by which time B has fetched the old
#   committed offsets. Every commit A makes after B's JoinGroup is refused, so the records A made
#   durable since its last accepted commit are answered again by B (seen: 392 on one partition).
#   A real broker accepts commits from the current generation while it prepares the rebalance.
# - Cooperative-sticky was tried (revoke after the new generation is UP, which the mock accepts):
#   a commit sent after A's own JoinGroup waits behind it (the mock stops reading a connection
#   while its JoinGroup is pending: rd_kafka_mock_connection_set_blocking in the JoinGroup
#   handler) and is answered after the election with ILLEGAL_GENERATION (check_state compares the
#   generation before the state; a real broker answers REBALANCE_IN_PROGRESS there); librdkafka
#   2.0.2 then sets its generation to -1 (rd_kafka_cgrp_op_handle_OffsetCommit), its SyncGroup
#   fails and the assignment counts as lost, uncommitted: B answered all 2,500 records of the
#   partitions again. So neither protocol gives zero copies against this mock.
# That is the documented at-least-once across folders; a rebalance may repeat at most one
# consumer's in-flight window (QUEUE_CAP x 2 + lookahead + one commit's records).
[ "$kin_dups" -le 1200 ] || { echo "FAIL: $kin_dups records answered in both folders"; exit 1; }
checked=$(kin_offsets_ok g1 "$work/a" "$work/b")
lz4 -dc "$work/a/completions.jsonl.lz4" | sed -n 1p | node -e '
  const r = JSON.parse(require("fs").readFileSync(0, "utf8")), s = r.source;
  const ok = s && s.topic === "jobs" && s.partition >= 0 && s.offset >= 0 && /^k\d+$/.test(s.key) &&
    s.headers.length === 1 && s.headers[0].name === "origin" && s.headers[0].value === "kafka_tool" &&
    s.key === "k" + r.id.slice(1);
  if (!ok) { console.error("FAIL: source meta " + JSON.stringify(s)); process.exit(1); }'
n_drop=$(kin_drops "$work/a.log" "$work/b.log")
echo "kafka_source: 2 consumers, broker 1 down ${down_s} s: $n_a + $n_b ok records, $kin_dups in both folders (rebalance), $n_drop held records dropped at a revoke, $(cat "$work/verify.log"), $checked of 10000 offsets committed (none ahead of the manifests) ($(( $(date +%s) - t0 )) s)"

# 2. kill -9 mid-drain: committed offsets vs the manifest; then follow mode and SIGTERM (a
# smaller topic: a killed member keeps the group waiting for its session timeout, 6 s)
kin_topic=jobs2
kin_input 3000
"$build/kafka_tool" produce "$bs" jobs2 "$work/data/in.jsonl" --keyed >/dev/null
kin_split jobs2 4
kin_job "$work/c.json" "$work/c" g2
"$build/tokenmill" run "$work/c.json" >"$work/c.log" 2>&1 &
pid_c=$!; pids+=("$pid_c")
wait_for "$work/c.log" assigned 200
sleep 1
kill -9 "$pid_c"; wait "$pid_c" 2>/dev/null || true
checked=$(kin_offsets_ok g2 "$work/c")
dur_check_json
sed -i 's/"group": "g2",/"group": "g2", "mode": "follow",/' "$work/c.json"
"$build/tokenmill" run "$work/c.json" >"$work/c.log" 2>&1 &
pid_c=$!; pids+=("$pid_c")
for _ in $(seq 600); do
    n=$(node -e 'try { const c = require(process.argv[1]).counts; console.log(c.ok + c.failed) }
                 catch (e) { console.log(0) }' "$work/c/manifest.json")
    [ "$n" = 3000 ] && break
    sleep 0.1
done
kill -TERM "$pid_c"
rc=0; wait "$pid_c" || rc=$?
[ "$rc" = 0 ] || { echo "FAIL: SIGTERM in follow mode exited $rc"; tail "$work/c.log"; exit 1; }
kin_merge "$work/c"
[ "$kin_dups" = 0 ] || exit 1
kin_verify "$work/merged"
checked2=$(kin_offsets_ok g2 "$work/c")
echo "kafka_source: kill -9 with $checked offsets committed, all durable; follow + SIGTERM: $(cat "$work/verify.log"), $checked2 offsets committed"
echo "kafka_source: ok"
