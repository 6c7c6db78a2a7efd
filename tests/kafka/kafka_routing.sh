#!/usr/bin/env bash
# tests/kafka/kafka_routing.sh BUILD SRC - Kafka answers a consumer can route without parsing
# them (issue 39 #3; label kafka). kcat (Debian, beside tokenmill) produces 100 records to jobs:4:
# the first 60 keyed "k<id>" with a header origin=kcat, the last 40 without key or header; 4 of
# them are bad (error records). A Kafka-to-Kafka job (output.kafka.partitioning "input",
# error_topic "dead") answers them; kcat reads answers and dead back as JSON envelopes:
#   - an answer's key is the input's key (raw bytes), or the id's text without JSON quotes;
#   - its headers are the input's (origin=kcat) plus tokenmill.id and
#     tokenmill.source.{topic,partition,offset}, which name the input message exactly;
#   - an answer is in the input's partition (the error topic, 1 partition, is keyed);
#   - the 4 error records are in topic dead (native error shape, same headers), not errors.jsonl.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
. "$src/tests/kafka/kafka_lib.bash"
. "$src/tests/e2e/durable_lib.sh"
command -v kcat >/dev/null || { echo "kcat not installed (tools/setup)"; exit 77; }
dur_setup 5 # the tiny model
kin_mock jobs:4 answers:4 dead:1
kin_input 100
head -60 "$work/data/in.jsonl" | awk '{ match($0, /"r[0-9]+"/); print "k" substr($0, RSTART + 2, RLENGTH - 3) "\t" $0 }' |
    kcat -P -b "$bs" -t jobs -K $'\t' -H origin=kcat
tail -40 "$work/data/in.jsonl" | kcat -P -b "$bs" -t jobs
kcat -C -b "$bs" -t jobs -e -q -J >"$work/in.json"
kin_job "$work/a.json" "$work/a" g1 '{ "brokers": "'"$bs"'", "topic": "answers", "partitioning": "input", "error_topic": "dead" }'
sed -i 's/"group": "g1",/"group": "g1", "max_read_ahead": 64,/' "$work/a.json"
if [ -d "$src/third_party/npm/node_modules/ajv" ]; then
    node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/job.schema.json" "$work/a.json"
fi
"$build/tokenmill" run "$work/a.json" >"$work/a.log" 2>&1 || { echo "FAIL: run"; tail "$work/a.log"; exit 1; }
kcat -C -b "$bs" -t answers -e -q -J >"$work/answers.json"
kcat -C -b "$bs" -t dead -e -q -J >"$work/dead.json"
node -e '
  const fs = require("fs"), rd = (f) => fs.readFileSync(f, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
  const [inp, ans, dead] = process.argv.slice(1, 4).map(rd), errs = process.argv[4];
  const byPos = new Map(inp.map((m) => [m.partition + ":" + m.offset, m]));
  const hdr = (m) => { const h = {}, a = m.headers || []; for (let i = 0; i < a.length; i += 2) h[a[i]] = a[i + 1]; return h; };
  const fail = (s) => { console.error("FAIL: " + s); process.exit(1); };
  const check = (m, what) => {
    const h = hdr(m), src = byPos.get(h["tokenmill.source.partition"] + ":" + h["tokenmill.source.offset"]);
    if (!src || h["tokenmill.source.topic"] !== "jobs") fail(what + " names no input message: " + JSON.stringify(h));
    if (what === "answer" && m.partition !== src.partition) fail(what + " in partition " + m.partition + ", input in " + src.partition);
    const v = JSON.parse(m.payload), id = v.id === undefined ? null : String(v.id);
    if (src.key !== null && src.key !== undefined) {
      if (m.key !== src.key) fail(what + " key " + m.key + " != input key " + src.key);
      if (hdr(src).origin !== "kcat" || h.origin !== "kcat") fail(what + " lost the input header origin");
    } else if (id !== null && m.key !== id) fail(what + " key " + JSON.stringify(m.key) + " != id text " + id);
    if (id !== null && h["tokenmill.id"] !== id) fail(what + " tokenmill.id " + h["tokenmill.id"] + " != " + id);
  };
  ans.forEach((m) => check(m, "answer"));
  dead.forEach((m) => { check(m, "error record"); if (!JSON.parse(m.payload).error) fail("dead holds a non-error"); });
  if (ans.length !== 96 || dead.length !== 4) fail(ans.length + " answers and " + dead.length + " errors (want 96 and 4)");
  if (fs.existsSync(errs) && fs.readFileSync(errs, "utf8").length) fail("errors.jsonl is not empty");
  const keyed = ans.filter((m) => /^k/.test(m.key)).length;
  console.log("kafka_routing: 96 answers (" + keyed + " with the input key, " + (96 - keyed) + " keyed by the id text), 4 error records in dead; headers and partitions match the inputs");
' "$work/in.json" "$work/answers.json" "$work/dead.json" "$work/a/errors.jsonl"
echo "kafka_routing: ok"
