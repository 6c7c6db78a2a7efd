#!/usr/bin/env bash
# tests/e2e/e2e_demo_model.sh BUILD SRC - the trained demo model (models/demo-pystdlib) on the CPU
# engine through the CLI, against transformers' answers (tests/fixtures/demo_model/, made by
# tests/oracles/hf/make_demo_fixture.py on the GPU machine) and against a random-weight model of the
# same shape and tokenizer:
#  1. the fixtures belong to this model (sha256 of model.safetensors);
#  2. `tokenmill tokenize` gives Hugging Face tokenizers' ids for all held-out strings;
#  3. prompt_logprobs of a held-out stdlib file: same ids, and the summed logprob within 1e-4
#     (relative) of transformers'; mean NLL under 3.0 nats/token and under half the random model's;
#  4. greedy continuations of 10 code prompts equal transformers' token for token, up to the first
#     step where transformers' top-2 logits are within 1e-3 (a near tie either side may break);
#  5. greedy "import " names a standard-library module; the demo job (jobs/demo.json, 2 threads)
#     answers all 10 records, none empty, well within the minute `make demo` is allowed.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
model="$src/models/demo-pystdlib"
fx="$src/tests/fixtures/demo_model"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1.
want=$(node -e 'console.log(require(process.argv[1]).model_sha256)' "$fx/reference.json")
got=$(sha256sum "$model/model.safetensors" | cut -d' ' -f1)
[ "$want" = "$got" ] || { echo "model.safetensors $got is not the model of the fixtures ($want)"; exit 1; }

# 2.
node -e '
  const fs = require("fs");
  for (const l of fs.readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean))
    console.log(JSON.stringify({ text: JSON.parse(l).text }));' "$fx/tok_agree.jsonl" >"$work/tok_in.jsonl"
"$build/tokenmill" tokenize "$model" <"$work/tok_in.jsonl" >"$work/tok_out.jsonl"
node -e '
  const fs = require("fs");
  const ref = fs.readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean).map(JSON.parse);
  const got = fs.readFileSync(process.argv[2], "utf8").split("\n").filter(Boolean).map(JSON.parse);
  if (got.length !== ref.length) { console.log(`tokenize: ${got.length} lines for ${ref.length}`); process.exit(1); }
  let bad = 0;
  ref.forEach((r, i) => { if (JSON.stringify(r.ids) !== JSON.stringify(got[i].ids)) {
    if (bad++ < 3) console.log("tokenize differs:", JSON.stringify(r.text), r.ids, got[i].ids); } });
  if (bad) { console.log(`${bad} of ${ref.length} strings tokenized differently from HF tokenizers`); process.exit(1); }
  console.log(`tokenizer: ${ref.length} held-out strings, ids equal to HF tokenizers`);' \
    "$fx/tok_agree.jsonl" "$work/tok_out.jsonl"

# 3. and 4.: one job on the trained model, the held-out record on a random one too
node -e '
  const ref = require(process.argv[1]);
  const out = [{ id: "heldout", prompt: ref.heldout.text, max_tokens: 0, prompt_logprobs: true }];
  ref.greedy.forEach((g, i) => out.push({ id: `g${i}`, prompt: g.prompt, max_tokens: g.ids.length,
                                          temperature: 0, logprobs: true }));
  console.log(out.map((r) => JSON.stringify(r)).join("\n"));' "$fx/reference.json" >"$work/in.jsonl"
job() { # MODEL OUT
    cat <<JOB
{ "model": "$1", "input": { "files": ["$work/in.jsonl"] }, "output": { "dir": "$2" },
  "engine": { "backend": "cpu", "threads": 2, "max_seqs": 8, "max_batched_tokens": 1024 } }
JOB
}
job "$model" "$work/out" >"$work/job.json"
"$build/tokenmill" -q run "$work/job.json"
"$build/mkmodel" --out "$work/random" --arch llama --seed 7 --layers 6 --hidden 256 --heads 4 \
    --kv-heads 2 --ff 512 --vocab 4096 --ctx 1024 --tied 1 --dtype bf16 --tokenizer "$model" >/dev/null
head -1 "$work/in.jsonl" >"$work/in1.jsonl"
job "$work/random" "$work/out-random" | sed "s#$work/in.jsonl#$work/in1.jsonl#" >"$work/job-random.json"
"$build/tokenmill" -q run "$work/job-random.json"
lz4 -dc "$work/out/completions.jsonl.lz4" >"$work/out.jsonl"
lz4 -dc "$work/out-random/completions.jsonl.lz4" >"$work/out-random.jsonl"
node -e '
  const fs = require("fs");
  const ref = require(process.argv[1]);
  const rows = (f) => new Map(fs.readFileSync(f, "utf8").split("\n").filter(Boolean).map(JSON.parse)
                                .map((r) => [r.id, r]));
  const got = rows(process.argv[2]), rnd = rows(process.argv[3]).get("heldout");
  let fail = 0;
  const check = (ok, msg) => { console.log((ok ? "ok   " : "FAIL ") + msg); if (!ok) fail++; };
  // 3. held-out scoring
  const nll = (r) => { const lp = r.prompt_logprobs.token_logprobs.filter((x) => x !== null);
                       return { sum: lp.reduce((a, b) => a + b, 0), n: lp.length }; };
  const h = got.get("heldout"), s = nll(h), sr = nll(rnd);
  check(JSON.stringify(h.prompt_logprobs.token_ids) === JSON.stringify(ref.heldout.ids),
        `held-out snippet: ${h.prompt_logprobs.token_ids.length} prompt ids equal HF (BOS first)`);
  const rel = Math.abs(s.sum - ref.heldout.logprob_sum) / Math.abs(ref.heldout.logprob_sum);
  check(s.n === ref.heldout.n_scored && rel < 1e-4,
        `held-out logprob sum ${s.sum.toFixed(4)} vs transformers ${ref.heldout.logprob_sum.toFixed(4)} ` +
        `(rel diff ${rel.toExponential(2)}, ${s.n} tokens)`);
  const mean = -s.sum / s.n, meanr = -sr.sum / sr.n;
  check(mean < 3.0 && mean < 0.5 * meanr,
        `held-out mean NLL ${mean.toFixed(4)} nats/token; random weights ${meanr.toFixed(4)}; ` +
        `uniform ${Math.log(4096).toFixed(4)}`);
  // 4. greedy continuations
  let compared = 0;
  ref.greedy.forEach((g, i) => {
    const ids = got.get(`g${i}`).logprobs.token_ids;
    let k = 0;
    for (; k < g.ids.length; k++) {
      if (k >= ids.length) { // tokenmill stopped: only at an end-of-sequence token transformers chose too
        check(g.ids[k - 1] === 1, `greedy ${JSON.stringify(g.prompt)} ended early at step ${k}`);
        break;
      }
      if (ids[k] !== g.ids[k]) {
        check(g.margins[k] < 1e-3, `greedy ${JSON.stringify(g.prompt)} step ${k}: ${ids[k]} vs ` +
              `transformers ${g.ids[k]} (margin ${g.margins[k]})`);
        break;
      }
      compared++;
      if (g.margins[k] < 1e-3) break; // near tie: the rest may differ
    }
  });
  check(compared >= 0.9 * ref.greedy.reduce((a, g) => a + g.ids.length, 0),
        `greedy: ${compared} tokens of ${ref.greedy.length} prompts equal transformers`);
  // 5. "import " names a stdlib module
  const gi = ref.greedy.findIndex((g) => g.prompt === "import ");
  const first = got.get(`g${gi}`).text.split(/[\s.,;]/)[0];
  check(ref.stdlib_modules.includes(first), `greedy "import " -> "import ${first}", a stdlib module`);
  process.exit(fail ? 1 : 0);' "$fx/reference.json" "$work/out.jsonl" "$work/out-random.jsonl"

# 5. the demo job as `make demo` runs it (copied so the output stays in $work), on 2 threads
mkdir -p "$work/demo/data"
cp "$src/jobs/data/demo.jsonl" "$work/demo/data/"
sed -e "s#\"../models/demo-pystdlib\"#\"$model\"#; s#\"../out/demo\"#\"out\"#" \
    -e 's#"backend": "cpu",#"backend": "cpu", "threads": 2,#' "$src/jobs/demo.json" >"$work/demo/demo.json"
t0=$(date +%s%N)
"$build/tokenmill" -q run "$work/demo/demo.json"
ms=$((($(date +%s%N) - t0) / 1000000))
n=$(lz4 -dc "$work/demo/out/completions.jsonl.lz4" | node -e '
  const rows = require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean).map(JSON.parse);
  console.log(rows.filter((r) => r.text.trim().length > 0).length);')
[ "$n" = 10 ] && [ ! -s "$work/demo/out/errors.jsonl" ] ||
    { echo "demo job: $n non-empty completions of 10"; cat "$work/demo/out/errors.jsonl"; exit 1; }
[ "$ms" -lt 30000 ] || { echo "demo job took $ms ms (make demo must stay under a minute)"; exit 1; }
echo "demo job: 10 completions in $ms ms"
"$src/tools/demo_summary" "$work/demo/out" "$model" "$work/demo/data/demo.jsonl" >"$work/summary.txt"
grep -q "^== model .*4.59 M-parameter Llama .*Python standard library.*not a general model" \
    "$work/summary.txt" || { echo "demo_summary does not say what the model is"; cat "$work/summary.txt"; exit 1; }
grep -q "^--- imports (" "$work/summary.txt" || { echo "demo_summary shows no completions"; exit 1; }
echo "e2e_demo_model: ok"
