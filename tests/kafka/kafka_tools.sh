#!/usr/bin/env bash
# tests/kafka/kafka_tools.sh BUILD SRC - the Kafka test tools on the mock cluster (label kafka):
# tools/kafka_mock starts a 3-broker cluster with topic jobs:4 and prints its bootstrap servers;
# tools/kafka_tool produces 10,000 JSONL lines, keyed so they spread over the 4 partitions
# (unkeyed messages stick to one partition for a linger period), the second half while broker 1
# is down for 3 s, and reads the topic back: exactly the 10,000 lines, each once, over the 4
# partitions.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
. "$src/tests/kafka/kafka_lib.bash"
command -v kcat >/dev/null || { echo "kcat not installed (tools/setup)"; exit 77; }
kin_mock jobs:4 # fault commands go through fd 3

seq 1 10000 | awk '{printf "{\"id\":%d,\"prompt\":\"p%d\"}\n", $1, $1}' >"$work/in.jsonl"
head -5000 "$work/in.jsonl" >"$work/a.jsonl"
tail -5000 "$work/in.jsonl" >"$work/b.jsonl"
"$build/kafka_tool" produce "$bs" jobs "$work/a.jsonl" --keyed | grep -qx "produced 5000"
echo "down 1" >&3
( sleep 3; echo "up 1" >&3 ) &
"$build/kafka_tool" produce "$bs" jobs "$work/b.jsonl" --keyed 2>"$work/produce_b.err" | grep -qx "produced 5000"
wait $! 2>/dev/null || true

"$build/kafka_tool" consume "$bs" jobs --meta >"$work/out.tsv"
cut -f3 "$work/out.tsv" | sort >"$work/got.sorted"
sort "$work/in.jsonl" >"$work/want.sorted"
cmp -s "$work/got.sorted" "$work/want.sorted" || { echo "consumed lines differ from produced"; diff "$work/want.sorted" "$work/got.sorted" | head; exit 1; }
parts=$(cut -f1 "$work/out.tsv" | sort -u | tr '\n' ' ')
[ "$parts" = "0 1 2 3 " ] || { echo "partitions used: $parts"; exit 1; }

# kafka_mock as a user tool (docs/kafka.md): "create" adds a topic while it runs; with --stdin it
# keeps serving after its input ends (kcat, a client of its own, produces and consumes there),
# and exits by itself only with --exit-on-eof.
echo "create extra 3" >&3
for _ in $(seq 50); do grep -q "create extra" "$work/mock.err" && break; sleep 0.1; done
n=$(kcat -L -b "$bs" -t extra 2>/dev/null | grep -c "partition [0-9]")
[ "$n" = 3 ] || { echo "create: topic extra has $n partitions"; cat "$work/mock.err"; exit 1; }
"$build/kafka_mock" --stdin t1:2 </dev/null >"$work/m2.out" 2>"$work/m2.err" &
m2=$!; pids+=("$m2")
for _ in $(seq 100); do grep -q bootstrap "$work/m2.out" 2>/dev/null && break; sleep 0.1; done
for _ in $(seq 50); do grep -q "stdin closed" "$work/m2.err" && break; sleep 0.1; done
kill -0 "$m2" || { echo "kafka_mock exited when its stdin closed"; exit 1; }
bs2=$(sed -n 's/^bootstrap.servers=//p' "$work/m2.out")
echo '{"id":"k1","prompt":"hello"}' | kcat -P -b "$bs2" -t t1 -k k1
kcat -C -b "$bs2" -t t1 -e -q | grep -qx '{"id":"k1","prompt":"hello"}' || { echo "kcat read nothing back"; exit 1; }
kill "$m2"
timeout 20 "$build/kafka_mock" --stdin --exit-on-eof t1:1 </dev/null >/dev/null 2>&1 ||
    { echo "kafka_mock --exit-on-eof did not exit 0 by itself"; exit 1; }
echo "kafka_tools: ok (10000 lines, partitions $parts; create, kcat after stdin closed, --exit-on-eof)"
