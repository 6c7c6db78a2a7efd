#!/usr/bin/env bash
# tests/kafka/kafka_figures.sh BUILD SRC - the Kafka figures and accounting a user reads (issue 39
# #4, #5; label kafka). kcat (beside tokenmill) produces 40 keyed records to jobs:2, 2 tombstones
# (null values, kcat -Z) and 1 empty value. A drain-mode job with a Prometheus textfile and
# input.kafka.config enable.auto.commit=true:
#   - warns that enable.auto.commit=true is overridden;
#   - metrics.json has kafka.partitions (both partitions: committed offset, position, high
#     watermark, lag; committed offsets reach the high watermarks), kafka.tombstones 2 and
#     kafka.empty_values 1, and logs the skip;
#   - the textfile (rewritten every second, the run's periodic snapshot) has tokenmill_kafka_lag,
#     tokenmill_kafka_committed_offset and tokenmill_kafka_read_ahead per partition and the
#     counters tokenmill_kafka_offset_commits_total (some), _errors_total, _released_total (0);
#     metrics.json kafka.commits, .errors, .released likewise.
# A rerun after 5 more records logs the records the earlier run committed (40, the job's counts,
# not the last run's done set) and ends with 45 records in all. Then the brokers go down and up
# under a follow-mode job writing its answers to Kafka (all brokers: whichever the consumer and
# the producer use): for the consumer (kafka_in) and for the producer (kafka_out) the log names
# the brokers once when they stop answering (the producer's line also names the error) and once
# when they are back, no raw librdkafka lines (5 more records, produced once the brokers are back,
# are answered to the output topic through them).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
. "$src/tests/kafka/kafka_lib.bash"
. "$src/tests/e2e/durable_lib.sh"
command -v kcat >/dev/null || { echo "kcat not installed (tools/setup)"; exit 77; }
dur_setup 5 # the tiny model
kin_mock jobs:2 answers:2
kin_input 45
keyed() { awk '{ match($0, /"r[0-9]+"/); print "k" substr($0, RSTART + 2, RLENGTH - 3) "\t" $0 }'; }
head -40 "$work/data/in.jsonl" | keyed | kcat -P -b "$bs" -t jobs -K $'\t'
printf 'gone1\t\ngone2\t\n' | kcat -P -b "$bs" -t jobs -K $'\t' -Z
printf 'blank\t\n' | kcat -P -b "$bs" -t jobs -K $'\t'
kin_job "$work/a.json" "$work/a" g1
sed -i 's/"session.timeout.ms": "6000",/"session.timeout.ms": "6000", "enable.auto.commit": "true",/;
        s|"output": {|"output": { "prometheus_textfile": "'"$work"'/tm.prom",|' "$work/a.json"
"$build/tokenmill" run "$work/a.json" >"$work/a1.log" 2>&1 || { echo "FAIL: run 1"; tail "$work/a1.log"; exit 1; }
grep -q "enable.auto.commit=true is overridden" "$work/a1.log" || { echo "FAIL: no override warning"; exit 1; }
grep -q "2 tombstone(s) (null values) and 1 empty value(s) made no record" "$work/a1.log" ||
    { echo "FAIL: skip not logged"; grep kafka "$work/a1.log" | tail; exit 1; }
node -e '
  const m = require(process.argv[1]), k = m.kafka, fail = (s) => { console.error("FAIL: " + s + " " + JSON.stringify(k)); process.exit(1); };
  if (!k || k.tombstones !== 2 || k.empty_values !== 1) fail("skip counts");
  if (!(k.commits >= 1) || !(k.errors >= 0) || k.released !== 0) fail("counters");
  if (k.partitions.length !== 2) fail("partitions");
  let high = 0;
  for (const p of k.partitions) {
    if (p.topic !== "jobs" || !(p.high_watermark > 0) || !(p.committed >= 0) || !(p.lag >= 0) || !(p.position > 0)) fail("figures");
    if (p.lag !== p.high_watermark - p.committed) fail("lag is not high - committed");
    high += p.high_watermark;
  }
  if (high !== 43) fail("high watermarks sum " + high + " (want 43 messages)");
  if (m.records.ok + m.records.failed !== 40) fail("records " + JSON.stringify(m.records));' "$work/a/metrics.json" ||
    { grep kafka_in "$work/a1.log" | tail; exit 1; }
if [ -d "$src/third_party/npm/node_modules/ajv" ]; then # the new fields follow the schemas
    node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/metrics.schema.json" "$work/a/metrics.json"
    node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/manifest.schema.json" "$work/a/manifest.json"
fi
for metric in tokenmill_kafka_lag tokenmill_kafka_committed_offset tokenmill_kafka_read_ahead; do
    for p in 0 1; do
        grep -q "^$metric{job=\".*\",topic=\"jobs\",partition=\"$p\"} [0-9]" "$work/tm.prom" ||
            { echo "FAIL: no $metric for partition $p"; cat "$work/tm.prom"; exit 1; }
    done
done
# the consumer's counters: its offset commits (some accepted), errors and released records
grep -q '^tokenmill_kafka_offset_commits_total{job=".*"} [1-9][0-9]*$' "$work/tm.prom" &&
    grep -q '^tokenmill_kafka_errors_total{job=".*"} [0-9]*$' "$work/tm.prom" &&
    grep -q '^tokenmill_kafka_released_total{job=".*"} 0$' "$work/tm.prom" ||
    { echo "FAIL: Kafka counters in the textfile"; grep kafka "$work/tm.prom"; exit 1; }
tail -5 "$work/data/in.jsonl" | keyed | kcat -P -b "$bs" -t jobs -K $'\t'
"$build/tokenmill" run "$work/a.json" >"$work/a2.log" 2>&1 || { echo "FAIL: run 2"; tail "$work/a2.log"; exit 1; }
grep -q "resuming in .*: 40 records committed by 1 earlier run(s)" "$work/a2.log" ||
    { echo "FAIL: resume line"; grep resuming "$work/a2.log"; exit 1; }
n=$(node -e 'const c = require(process.argv[1]).counts; console.log(c.ok + c.failed)' "$work/a/manifest.json")
[ "$n" = 45 ] || { echo "FAIL: $n records in all after the rerun (want 45)"; exit 1; }
lag=$(node -e 'console.log(require(process.argv[1]).kafka.lag_total)' "$work/a/metrics.json")

# A broker outage (all 3, so the consumer's own brokers are among them, whatever the mock's
# leaders) while a job runs (follow mode, stopped by SIGTERM once the brokers are back):
# no raw librdkafka line, one line naming the broker when it stops answering and one when it is
# back (librdkafka's detail only at -v).
kin_job "$work/f.json" "$work/f" g2 '{"brokers": "'"$bs"'", "topic": "answers"}'
sed -i 's/"group": "g2",/"group": "g2", "mode": "follow",/' "$work/f.json"
n_answers() { kcat -C -b "$bs" -t answers -e -q -f 'x\n' 2>/dev/null | wc -l; }
n0=$(n_answers)
"$build/tokenmill" run "$work/f.json" >"$work/f.log" 2>&1 &
pid_f=$!; pids+=("$pid_f")
for _ in $(seq 600); do grep -q "partition(s) assigned" "$work/f.log" && break; sleep 0.1; done
# the producer must be talking to its brokers before they go: until the job's first answer lands,
# the producer has only the bootstrap connection, and a broker it never used is not "down" for it
# (on a loaded machine the outage came before the first fetch, and kafka_out had nothing to say)
for _ in $(seq 600); do [ "$(n_answers)" -gt "$n0" ] && break; sleep 0.1; done
[ "$(n_answers)" -gt "$n0" ] || { echo "FAIL: no answer from the follow job within 60 s"; tail "$work/f.log"; exit 1; }
echo "down -1" >&3
for m in kafka_in kafka_out; do
    for _ in $(seq 600); do grep -q "$m: brokers not answering" "$work/f.log" && break; sleep 0.1; done
done
echo "up -1" >&3
head -5 "$work/data/in.jsonl" | sed 's/"r\([0-9]\)"/"again\1"/' | keyed | kcat -P -b "$bs" -t jobs -K $'\t'
for m in kafka_in kafka_out; do
    for _ in $(seq 600); do grep -q "$m: brokers: every broker in use is up again" "$work/f.log" && break; sleep 0.1; done
done
kill -TERM "$pid_f"; wait "$pid_f" || { echo "FAIL: follow run"; tail "$work/f.log"; exit 1; }
raw=$(grep -c '^%[0-9]|' "$work/f.log" || true)
summary=""
for m in kafka_in kafka_out; do
    downs=$(grep -c "$m: brokers not answering: [0-9.:]*/[0-9]" "$work/f.log" || true)
    ups=$(grep -c "$m: brokers: every broker in use is up again" "$work/f.log" || true)
    [ "$raw" = 0 ] && [ "$downs" -ge 1 ] && [ "$ups" -ge 1 ] ||
        { echo "FAIL: broker outage log of $m: $raw raw lines, $downs down and $ups up lines"; grep "$m" "$work/f.log"; exit 1; }
    summary="$summary $m $downs + $ups,"
done
# the producer's line names the error too; no line per librdkafka error
grep -q "kafka_out: brokers not answering: [0-9.:]*/[0-9].* (.*; retrying" "$work/f.log" ||
    { echo "FAIL: the producer's summary names no error"; grep kafka_out "$work/f.log"; exit 1; }
n_out=$(grep -c "kafka_out" "$work/f.log" || true)
[ "$n_out" -le 6 ] || { echo "FAIL: $n_out kafka_out lines for one outage"; grep kafka_out "$work/f.log"; exit 1; }
echo "kafka_figures: brokers down and up: summary lines$summary no raw librdkafka line ($(grep -o '[0-9]* librdkafka lines and broker errors' "$work/f.log" | paste -sd/) at -v only)"
echo "kafka_figures: override warned, 2 tombstones + 1 empty value counted, lag per partition in metrics.json (total $lag at the end) and the textfile, resume line 40 -> 45 records"
echo "kafka_figures: ok"
