#!/usr/bin/env bash
# tests/kafka/kafka_identity.sh BUILD SRC - a resumed Kafka job never skips a recreated topic's
# records (issue 39 #1; label kafka). Only input.kafka.topics enter the job's identity, so the
# same job file may point at other brokers; the done offsets in the output folder then name
# records of another topic. Cluster 1 (topic jobs:4, 200 keyed records) is drained into folder a;
# 40 new records there are answered by a rerun (the checks pass on the unchanged topic). Each
# rerun below must fail, the error naming the topic (or cluster) and what changed, with the
# hint (new output.dir or --restart), and leave a's counts as they were (1-3 run with the
# manifest's cluster id removed, so that each check is seen alone):
#   1. cluster 2 has jobs:2 (480 records): the partition count shrank;
#   2. cluster 3 has jobs:4 with 20 records: a partition's high watermark is below its done
#      offsets;
#   3. cluster 3 after 240 more records (watermarks above the done offsets): the fingerprint (one done message per partition, read again) has
#      another timestamp; this is the case of a recreated topic of the same size;
#   4. the manifest names another cluster id: refused by the cluster id alone.
# kcat (Debian) produces the new records, a client independent of tokenmill's.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
. "$src/tests/kafka/kafka_lib.bash"
. "$src/tests/e2e/durable_lib.sh"
command -v kcat >/dev/null || { echo "kcat not installed (tools/setup)"; exit 77; }
dur_setup 5 # the tiny model
kin_mock jobs:4
kin_input 240
head -200 "$work/data/in.jsonl" >"$work/data/first.jsonl"
tail -40 "$work/data/in.jsonl" >"$work/data/more.jsonl"
"$build/kafka_tool" produce "$bs" jobs "$work/data/first.jsonl" --keyed >/dev/null

extra_mock() { # TOPIC:N: another cluster in its own process; sets $bs
    "$build/kafka_mock" "$1" >"$work/mock2.out" 2>"$work/mock2.err" &
    pids+=("$!")
    for _ in $(seq 100); do grep -q bootstrap "$work/mock2.out" 2>/dev/null && break; sleep 0.1; done
    bs=$(sed -n 's/^bootstrap.servers=//p' "$work/mock2.out")
    [ -n "$bs" ] || { echo "mock did not start"; cat "$work/mock2.err"; exit 1; }
}
kc_produce() { # FILE: kcat, keyed by the line's id
    node -e 'for (const l of require("fs").readFileSync(process.argv[1], "utf8").split("\n"))
               if (l) { const m = /"id": *"(r\d+)"/.exec(l); console.log((m ? m[1] : "x") + "\t" + l); }' "$1" |
        kcat -P -b "$bs" -t jobs -K $'\t' -z none 2>"$work/kcat.err" || { cat "$work/kcat.err"; exit 1; }
}
answered() { node -e 'const c = require(process.argv[1]).counts; console.log(c.ok + c.failed)' "$work/a/manifest.json"; }

kin_job "$work/a.json" "$work/a" g1
"$build/tokenmill" run "$work/a.json" >"$work/a1.log" 2>&1 || { echo "FAIL: first run"; tail "$work/a1.log"; exit 1; }
[ "$(answered)" = 200 ] || { echo "FAIL: first run answered $(answered)"; exit 1; }
node -e 'const m = require(process.argv[1]).input_kafka;
  if (!m.cluster_id || m.partitions.some((p) => !p.check)) { console.error("FAIL: no identity in the manifest " + JSON.stringify(m)); process.exit(1); }' "$work/a/manifest.json"
kc_produce "$work/data/more.jsonl"
"$build/tokenmill" run "$work/a.json" >"$work/a2.log" 2>&1 || { echo "FAIL: rerun on the same topic"; tail "$work/a2.log"; exit 1; }
[ "$(answered)" = 240 ] || { echo "FAIL: rerun answered $(answered) in all, not 240"; exit 1; }
grep -q "partition(s) checked against this folder's offsets" "$work/a2.log" || { echo "FAIL: no check logged"; tail "$work/a2.log"; exit 1; }
# Mock clusters may share an id (librdkafka derives it from two addresses): checks 1-3 run
# without it, so each is seen alone; 4 puts one back.
node -e 'const fs = require("fs"), f = process.argv[1], m = JSON.parse(fs.readFileSync(f, "utf8"));
  delete m.input_kafka.cluster_id; fs.writeFileSync(f, JSON.stringify(m));' "$work/a/manifest.json"

refused() { # NAME WANT...: the rerun fails naming each WANT, the topic and the hint; a unchanged
    local name=$1 rc=0; shift
    kin_job "$work/a.json" "$work/a" g1 # brokers $bs
    timeout 120 "$build/tokenmill" run "$work/a.json" >"$work/$name.log" 2>&1 || rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "FAIL $name: rc $rc"; tail "$work/$name.log"; exit 1; }
    local msg
    msg=$(grep ' E job: ' "$work/$name.log" || true)
    for want in "$@" "output.dir" "--restart"; do
        [[ "$msg" == *"$want"* ]] || { echo "FAIL $name: error does not name '$want'"; cat "$work/$name.log"; exit 1; }
    done
    [ "$(answered)" = 240 ] || { echo "FAIL $name: the folder changed"; exit 1; }
    echo "kafka_identity: $name refused: ${msg#* E job: }"
}

kill "$mock_pid"; mock_pid=""
extra_mock jobs:2
kc_produce "$work/data/in.jsonl"; kc_produce "$work/data/in.jsonl"
refused shrunk "topic jobs has 2 partition(s) now" "offsets of its partition" "recreated"
kill "${pids[-1]}"
extra_mock jobs:4
head -20 "$work/data/in.jsonl" >"$work/data/few.jsonl"
kc_produce "$work/data/few.jsonl"
refused watermark "topic jobs partition" "ends at offset" "recreated"
kc_produce "$work/data/in.jsonl"
refused fingerprint "topic jobs partition" "timestamp" "recreated"
node -e 'const fs = require("fs"), f = process.argv[1], m = JSON.parse(fs.readFileSync(f, "utf8"));
  m.input_kafka.cluster_id = "another-cluster"; fs.writeFileSync(f, JSON.stringify(m));' "$work/a/manifest.json"
refused cluster "recorded on cluster another-cluster"
echo "kafka_identity: ok"
