#!/usr/bin/env bash
# tests/kafka/kafka_startup.sh BUILD SRC - Kafka brokers that nothing answers for (issue 24 #7;
# label kafka): a job whose input.kafka (drain and follow mode) or output.kafka names a loopback
# port nothing listens on, with startup_timeout_s 2, fails within 5 s of its start (timestamps
# in its log: the model is loaded first) with a message naming the brokers, the topic and the
# setting, and shows one librdkafka line, not one per retry (before: about a minute of
# "Connect ... failed" lines, then "metadata of topic t: Local: Broker transport failure"). A
# startup_timeout_s out of range is a job-spec error naming the key.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
. "$src/tests/kafka/kafka_lib.bash"
. "$src/tests/e2e/durable_lib.sh"
dur_setup 5
cd "$work"

# A loopback port that nothing listens on (bound once by the kernel's choice, then closed).
port=$(node -e 'const s = require("net").createServer().listen(0, "127.0.0.1",
                  () => { console.log(s.address().port); s.close(); });')
bs="127.0.0.1:$port"

job() { # FILE INPUT_JSON OUTPUT_EXTRA_JSON
    cat >"$1" <<JOB
{ "model": "model", "input": $2,
  "output": { "dir": "out_$(basename "$1" .json)"$3 },
  "engine": { "backend": "cpu", "threads": 1 } }
JOB
}

# check NAME SETTING: the run of $NAME.json failed (not killed) within 5 s of its first log line,
# naming the brokers, the topic and SETTING, with one librdkafka line
check() {
    local name=$1 setting=$2 rc=0
    timeout 60 "$build/tokenmill" run "$name.json" >"$name.log" 2>&1 || rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "FAIL $name: rc $rc"; cat "$name.log"; exit 1; }
    local msg
    msg=$(grep ' E job: ' "$name.log" || true)
    for want in "brokers $bs" "topic t " "$setting"; do
        [[ "$msg" == *"$want"* ]] || { echo "FAIL $name: error does not name '$want'"; cat "$name.log"; exit 1; }
    done
    local secs
    secs=$(node -e '
      const ts = require("fs").readFileSync(process.argv[1], "utf8").split("\n")
        .map((l) => Date.parse(l.split(" ")[0])).filter((t) => !isNaN(t));
      console.log(((ts[ts.length - 1] - ts[0]) / 1000).toFixed(1));' "$name.log")
    node -e 'process.exit(+process.argv[1] <= 5 ? 0 : 1)' "$secs" ||
        { echo "FAIL $name: failed $secs s after its start (startup_timeout_s 2)"; cat "$name.log"; exit 1; }
    local raw shown
    raw=$(grep -c '^%[0-9]|' "$name.log" || true)
    shown=$(grep -c 'librdkafka: ' "$name.log" || true)
    [ "$raw" -eq 0 ] && [ "$shown" -eq 1 ] ||
        { echo "FAIL $name: $raw raw and $shown shown librdkafka lines (want 0 and 1)"; cat "$name.log"; exit 1; }
    echo "kafka_startup: $name failed after $secs s: ${msg#* E job: }"
}

kin='{ "kafka": { "brokers": "'$bs'", "topics": ["t"], "group": "g", "startup_timeout_s": 2'
job drain.json "$kin } }" ""
check drain input.kafka.startup_timeout_s
job follow.json "$kin, \"mode\": \"follow\" } }" ""
check follow input.kafka.startup_timeout_s
job sink.json '{ "files": ["data/in.jsonl"] }' \
    ', "kafka": { "brokers": "'$bs'", "topic": "t", "startup_timeout_s": 2 }'
check sink output.kafka.startup_timeout_s

# Out of range: a job-spec error naming the key, before anything connects.
job bad.json '{ "kafka": { "brokers": "'$bs'", "topics": ["t"], "group": "g", "startup_timeout_s": 0 } }' ""
rc=0
timeout 60 "$build/tokenmill" run bad.json >bad.log 2>&1 || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q 'input.kafka.startup_timeout_s' bad.log ||
    { echo "FAIL bad: rc $rc"; cat bad.log; exit 1; }
echo "kafka_startup: ok"
