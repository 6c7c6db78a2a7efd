#!/usr/bin/env bash
# bench/kafka_release_dups.sh BUILD [RUNS] - a rebalance while records are queued (issue 39):
# runs tests/kafka/kafka_release.sh RUNS times (default 3) and prints its figure line per run:
# records released at the revoke (each answered exactly once over both folders), each consumer's
# answers and the records answered in both folders. 160 records over jobs:4, 16 tokens each,
# max_read_ahead 10, one sequence at a time (tiny model), on librdkafka's mock cluster.
set -euo pipefail
build=$1
runs=${2:-3}
src=$(cd "$(dirname "$0")/.." && pwd)
for ((i = 1; i <= runs; i++)); do
    out=$(bash "$src/tests/kafka/kafka_release.sh" "$build" "$src" 2>&1) ||
        { echo "$out" | grep -E "FAIL" || echo "$out" | tail; exit 1; }
    echo "run $i: $(echo "$out" | grep -E "^kafka_release: [0-9]" | sed 's/; verify.*//')"
done
