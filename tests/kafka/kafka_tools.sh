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
echo "kafka_tools: ok (10000 lines, partitions $parts)"
