#!/usr/bin/env bash
# bench/mkmodel_dsv41_table.sh BUILD [ROWS] [DIR] - time `mkmodel --arch deepseek_v41` writing a
# large Engram table (two engram layers of about ROWS rows x 256 FP8 values + 8 scale bytes each,
# streamed and fsynced) and print bytes, seconds and MB/s. Removes the model afterwards.
set -euo pipefail
build=${1:?usage: $0 BUILD [ROWS] [DIR]}
rows=${2:-1000000}
dir=${3:-$(mktemp -d /tmp/tm_mkmodel_dsv41_XXXXXX)}
rm -rf "$dir/m"
t0=$(date +%s.%N)
"$build/mkmodel" --arch deepseek_v41 --out "$dir/m" --engram-dim 256 --engram-heads 4 \
    --engram-rows "$rows" >/dev/null
t1=$(date +%s.%N)
bytes=$(stat -c %s "$dir/m/model-00002-of-00002.safetensors")
awk -v b="$bytes" -v s="$(echo "$t1 - $t0" | bc)" -v r="$rows" \
    'BEGIN { printf "rows/layer ~%d  table shard %d bytes  %.2f s  %.0f MB/s\n", r, b, s, b / s / 1e6 }'
rm -rf "$dir/m"
