#!/usr/bin/env bash
# tests/kafka/kafka_drain_group.sh BUILD SRC - drain mode stays in its consumer group after it
# has read to the end (issue 39 #2; label kafka). Consumer A (drain mode, folder a) reads all 120
# records of jobs:4 (each asks for 64 tokens, one sequence at a time: the work outlasts the
# read by many seconds) and then, while it finishes them:
#   - commits offsets as records become durable: the group's committed offsets (read by
#     tools/kafka_tool, librdkafka beside tokenmill) reach 10 while A still runs (before: frozen until exit);
#   - takes part in a rebalance: consumer B (same group, folder b), started as A has read to the
#     end, gets partitions while A still runs: A logs partitions assigned back to it that it does
#     not read (before, B waited until A left the group).
# Both exit 0; each folder answers a record at most once and the union passes the exactly-once
# oracle. Records of the revoked partitions that A had read but not made durable when its revoke
# wait ended (half the session timeout) are answered by both: counted and printed (the
# at-least-once across folders of kafka_source.sh); they are at most A's records in flight.
# Part 2 bounds them: with input.kafka.max_read_ahead 4, 4 per revoked partition in flight (plus
# what the mock's refused commits add, see there).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
. "$src/tests/kafka/kafka_lib.bash"
. "$src/tests/e2e/durable_lib.sh"
dur_setup 5 # the tiny model
kin_mock jobs:4
kin_feed 120 64
wait_for() { # FILE PATTERN TENTHS
    for _ in $(seq "$3"); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "FAIL: no '$2' in $1"; tail "$1"; exit 1
}
committed_sum() { # the group's committed offsets over the 4 partitions (librdkafka's client)
    "$build/kafka_tool" committed "$bs" g1 jobs | awk '$2 > 0 { s += $2 } END { print s + 0 }'
}

kin_job "$work/a.json" "$work/a" g1
kin_job "$work/b.json" "$work/b" g1
sed -i 's/"max_seqs": 16/"max_seqs": 1/' "$work/a.json" "$work/b.json"
"$build/tokenmill" run "$work/a.json" >"$work/a.log" 2>&1 &
pid_a=$!; pids+=("$pid_a")
wait_for "$work/a.log" "read to the end: staying in group" 300
"$build/tokenmill" run "$work/b.json" >"$work/b.log" 2>&1 &
pid_b=$!; pids+=("$pid_b")
c=0
for _ in $(seq 300); do c=$(committed_sum); [ "$c" -ge 10 ] && break; sleep 0.1; done
a_alive=0; kill -0 "$pid_a" 2>/dev/null && a_alive=1
[ "$c" -ge 10 ] && [ "$a_alive" = 1 ] ||
    { echo "FAIL: $c offsets committed while A lingers (want 10; A running: $a_alive)"; tail "$work/a.log"; exit 1; }
wait_for "$work/b.log" "rebalance: [1-9][0-9]* partition(s) assigned" 300
rc_a=0 rc_b=0
wait "$pid_a" || rc_a=$?
wait "$pid_b" || rc_b=$?
[ "$rc_a" = 0 ] && [ "$rc_b" = 0 ] || { echo "FAIL: exit codes $rc_a $rc_b"; tail "$work/a.log" "$work/b.log"; exit 1; }
# A took part in the rebalance after it had read to the end: it gave its partitions up and got
# some back that it does not read (before, B was assigned only once A had left the group).
grep -q "partition(s) assigned (not read: this consumer has read to the end)" "$work/a.log" ||
    { echo "FAIL: A took no part in a rebalance after reading to the end"; grep kafka_in "$work/a.log"; exit 1; }
n_a=$(node -e 'const r = require(process.argv[1]).records; console.log(r.ok + r.failed)' "$work/a/metrics.json")
n_b=$(node -e 'const r = require(process.argv[1]).records; console.log(r.ok + r.failed)' "$work/b/metrics.json")
kin_merge --dedupe "$work/a" "$work/b"
kin_verify "$work/merged"
[ "$kin_dups" -le 120 ] || exit 1
kin_offsets_ok g1 "$work/a" "$work/b" >/dev/null
echo "kafka_drain_group: A committed offsets (sum $c) while finishing its read-ahead; B joined and got partitions while A ran; A answered $n_a, B $n_b, $kin_dups in both folders (A's read-ahead of the revoked partitions, not durable within the revoke wait); $(cat "$work/verify.log")"

# 2. input.kafka.max_read_ahead 4 (topic jobs2, 120 records, group g2): A holds at most 4
# records per partition in flight, so when B joins, the revoked partitions' records are mostly
# unread: B answers them. Answered by both: at most 4 per revoked partition (2 of 4) in flight at
# the revoke, plus what A finished of them between its last accepted commit and the revoke (the
# mock refuses the commits of a joining group, kafka_source.sh): one commit period (0.2 s) and
# one heartbeat interval (0.5 s) at under 10 records/s here. Bound 24.
kin_topic=jobs2
kin_input 120
sed -i 's/"max_tokens":[12]}/"max_tokens":20}/' "$work/data/in.jsonl"
"$build/kafka_tool" produce "$bs" jobs2 "$work/data/in.jsonl" --keyed >/dev/null
kin_split jobs2 4
rm -rf "$work/a" "$work/b"
kin_job "$work/a.json" "$work/a" g2
kin_job "$work/b.json" "$work/b" g2
sed -i 's/"max_seqs": 16/"max_seqs": 1/; s/"group": "g2",/"group": "g2", "max_read_ahead": 4,/' "$work/a.json" "$work/b.json"
"$build/tokenmill" run "$work/a.json" >"$work/a.log" 2>&1 &
pid_a=$!; pids+=("$pid_a")
wait_for "$work/a.log" "partition(s) assigned" 300
for _ in $(seq 300); do
    c=$("$build/kafka_tool" committed "$bs" g2 jobs2 | awk '$2 > 0 { s += $2 } END { print s + 0 }')
    [ "$c" -ge 12 ] && break; sleep 0.1
done
"$build/tokenmill" run "$work/b.json" >"$work/b.log" 2>&1 &
pid_b=$!; pids+=("$pid_b")
rc_a=0 rc_b=0
wait "$pid_a" || rc_a=$?
wait "$pid_b" || rc_b=$?
[ "$rc_a" = 0 ] && [ "$rc_b" = 0 ] || { echo "FAIL: exit codes $rc_a $rc_b"; tail "$work/a.log" "$work/b.log"; exit 1; }
n_a=$(node -e 'const r = require(process.argv[1]).records; console.log(r.ok + r.failed)' "$work/a/metrics.json")
n_b=$(node -e 'const r = require(process.argv[1]).records; console.log(r.ok + r.failed)' "$work/b/metrics.json")
kin_merge --dedupe "$work/a" "$work/b"
kin_verify "$work/merged"
[ "$n_b" -gt 0 ] || { echo "FAIL: B answered nothing"; tail "$work/b.log"; exit 1; }
[ "$kin_dups" -le 24 ] || { echo "FAIL: $kin_dups records in both folders (bound 24)"; exit 1; }
kin_offsets_ok g2 "$work/a" "$work/b" >/dev/null
echo "kafka_drain_group: max_read_ahead 4: A answered $n_a, B $n_b, $kin_dups in both folders (bound 24); $(cat "$work/verify.log")"
echo "kafka_drain_group: ok"
