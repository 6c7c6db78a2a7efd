#!/usr/bin/env bash
# bench/resume_identity.sh BUILD [SIZE=10G] - the cost of an input's resume identity (issue 35) on
# a large input: a SPARSE file of SIZE (truncate -s; its holes read as zeros from memory, so the
# figures are of the page cache and the hash, not of a disk) with a JSONL line every 64 MiB, and
# a tiny model folder (two JSON files). bench_identity times tm_manifest_identify (stat plus the
# 8 MiB content sample) and, for comparison, a read and xxh3 of the whole file.
set -euo pipefail
build=$(cd "$1" && pwd)
size=${2:-10G}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "# $(date -u +%FT%TZ) $(uname -n) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
cmake --build "$build" --target bench_identity >/dev/null
mkdir "$work/model"
echo '{"vocab_size": 10}' >"$work/model/config.json"
echo 'w' >"$work/model/model.safetensors"
truncate -s "$size" "$work/in.jsonl"
bytes=$(stat -c %s "$work/in.jsonl")
for ((off = 0; off < bytes; off += 64 << 20)); do
    printf '{"id":%d,"prompt":"x"}\n' "$off" | dd of="$work/in.jsonl" bs=1 seek="$off" conv=notrunc status=none
done
echo "input: $bytes bytes, sparse ($(du -k "$work/in.jsonl" | cut -f1) KiB allocated)"
"$build/bench_identity" "$work/model" "$work/in.jsonl" 7
