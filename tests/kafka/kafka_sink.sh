#!/usr/bin/env bash
# tests/kafka/kafka_sink.sh BUILD SRC - the Kafka sink (output.kafka) on the mock cluster (label kafka;
# tools/kafka_mock runs in its own process, so it outlives the kills):
#   1. idempotent producer: every ok record is one message keyed by its id; the consumed topic
#      plus errors.jsonl pass the exactly-once oracle (tests/oracles/verify_outputs.cjs);
#   2. kill -9 at 4 random points, then resume: nothing is lost; the idempotent mode is
#      at-least-once across crashes (a commit's records whose manifest was not yet durable are
#      sent again), so the oracle runs on the topic deduplicated by key and the duplicates are
#      counted;
#   3. transactional mode (transactional.id): each commit is one transaction; the oracle passes on
#      the raw topic. The mock cluster cannot check fencing by a second instance nor the filtering
#      of aborted records for read_committed consumers (librdkafka 2.0.2 mock: every InitProducerId
#      gets a new PID, Fetch reports no aborted transactions; TOOLCHAIN.md 2.3), so this checks the
#      client path (init, begin, produce, commit, begin) only; test_kafka_out covers
#      send_offsets_to_transaction.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
. "$src/tests/kafka/kafka_lib.bash"
. "$src/tests/e2e/durable_lib.sh"
dur_setup 160
kin_mock out1:3 out2:3 out3:3

set_kafka() { # TOPIC [TXN_ID]: output.kafka in the job
    node -e '
      const fs = require("fs"), [f, bs, topic, txn] = process.argv.slice(1);
      const j = JSON.parse(fs.readFileSync(f, "utf8"));
      j.output.kafka = {brokers: bs, topic, config: {"linger.ms": "5"}};
      if (txn) j.output.kafka.transactional_id = txn;
      fs.writeFileSync(f, JSON.stringify(j, null, 1));' "$work/job.json" "$bs" "$@"
}
oracle() { node "$src/tests/oracles/verify_outputs.cjs" "$work/t" "$work/data/in.jsonl"; }

# 1. idempotent producer, no crash
set_kafka out1
dur_run || { cat "$work/run.log"; exit 1; }
[ ! -s "$work/out/completions.jsonl.lz4" ] || { echo "FAIL: completions also went to the file"; exit 1; }
kin_topic_as_dir out1 "$work/out" >/dev/null
oracle
echo "kafka_sink: idempotent producer ok"

# 2. kill -9 at random points, resume; at-least-once, exactly once after dedupe by key
rm -rf "$work/out"
set_kafka out2
RANDOM=${TM_CRASH_SEED:-5}
kills=0
for k in 1 2 3 4; do
    "$build/tokenmill" -q run "$work/job.json" >"$work/run.log" 2>&1 &
    pid=$!
    sleep "0.$((3 + RANDOM % 6))"
    kill -9 "$pid" 2>/dev/null && kills=$((kills + 1))
    wait "$pid" 2>/dev/null || true
    dur_check_json
done
dur_run || { cat "$work/run.log"; exit 1; }
dups=$(kin_topic_as_dir out2 "$work/out" --dedupe)
oracle
echo "kafka_sink: $kills kills + resume ok ($dups duplicates, deduplicated by key)"

# 3. transactional producer
rm -rf "$work/out"
set_kafka out3 tm-kafka-sink-test
dur_run || { cat "$work/run.log"; exit 1; }
kin_topic_as_dir out3 "$work/out" >/dev/null
oracle
echo "kafka_sink: transactional producer ok (client path; see the header for what the mock cannot check)"
echo "kafka_sink: ok"
