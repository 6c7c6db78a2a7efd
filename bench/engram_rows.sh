#!/usr/bin/env bash
# bench/engram_rows.sh [BUILD] [ROWS] [TOKENS] [CACHE_MB] - Engram table rows read from disk
# (runner/model/engram_table.h): rows/s and us per token (48 rows: 2 Engram layers x 3 n-gram sizes
# x 8 heads) for random rows with the file's pages dropped (posix_fadvise DONTNEED: reads from the
# disk), with the file in the page cache, and with the rows in the row cache; 4 reader threads, and
# the cold case again with 1. The table file (ROWS x 256 FP8 + scales, default 4,000,000 rows =
# 1.06 GB) is written under $TMPDIR (default /tmp) and removed afterwards.
set -euo pipefail
build=${1:-build}
rows=${2:-4000000}
tokens=${3:-2000}
cache_mb=${4:-64}
src=$(cd "$(dirname "$0")/.." && pwd)
cmake --build "$build" --target bench_engram -j2 >/dev/null
dir=$(mktemp -d "${TMPDIR:-/tmp}/engram_bench.XXXXXX")
trap 'rm -rf "$dir"' EXIT
echo "# $(date -u +%FT%TZ) $(uname -r), $(nproc) cores, $(awk '/MemTotal/ {print $2/1048576 " GiB"}' /proc/meminfo); disk: $(df -h "$dir" | awk 'NR==2 {print $1}')"
"$build/bench_engram" "$dir/engram.safetensors" "$rows" "$tokens" "$cache_mb" 4
