#!/usr/bin/env bash
# bench/kafka_rebalance_dups.sh BUILD [RUNS] - records answered by both consumers of a group when
# a second drain-mode consumer joins a running one (issue 39 #2), with the default read-ahead
# (input.kafka.max_read_ahead 1024) and with max_read_ahead 4, on librdkafka's mock cluster:
# runs tests/kafka/kafka_drain_group.sh RUNS times (default 3) and prints its two figure lines
# per run. 120 records over 4 partitions, 64 tokens each (part 2: 20), one sequence at a time
# (tiny model).
set -euo pipefail
build=$1
runs=${2:-3}
src=$(cd "$(dirname "$0")/.." && pwd)
for ((i = 1; i <= runs; i++)); do
    out=$(bash "$src/tests/kafka/kafka_drain_group.sh" "$build" "$src" 2>&1) ||
        { echo "$out" | grep -E "FAIL" || echo "$out" | tail; exit 1; }
    echo "run $i:"
    echo "$out" | grep -E "^kafka_drain_group: (A committed|max_read_ahead)" | sed 's/; verify.*//'
done
