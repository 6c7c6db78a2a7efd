#!/usr/bin/env node
// tests/oracles/guided_check.cjs - independent check of structured-output answers
// (tests/e2e/e2e_guided.sh): every answer of a constrained record must have finish_reason
// "stop" and satisfy its constraint, judged by other engines than tokenmill's: JSON.parse plus
// ajv with ajv-formats (the pinned third_party/npm/node_modules copies, strict off so OpenAI
// schemas load as they are) for json_schema / guided_json, node's RegExp (whole match, "u" flag: ECMAScript
// semantics) for guided_regex, string equality for guided_choice, JSON.parse + "is an object"
// for json_object.
//
//   node guided_check.cjs INPUT.jsonl ANSWERS.jsonl [--expect-errors ERRORS.jsonl id=code...]
//
// Exit status: 0 all answers valid, 1 a violation (each printed), 2 usage/IO errors.
'use strict';
const fs = require('fs');
const path = require('path');
const nm = path.join(__dirname, '..', '..', 'third_party', 'npm', 'node_modules');
const Ajv = require(path.join(nm, 'ajv'));
const addFormats = require(path.join(nm, 'ajv-formats'));

const [inPath, outPath, ...rest] = process.argv.slice(2);
if (!inPath || !outPath) {
  console.error('usage: guided_check.cjs INPUT.jsonl ANSWERS.jsonl');
  process.exit(2);
}
const read = (p) => fs.readFileSync(p, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv); // "full" mode: days of each month, leap years, zones, address ranges
// draft 2020-12 for schemas with prefixItems (draft 7's ajv reads their "items": false as "no
// items at all"); draft 7's items lists stay with the default one
const Ajv2020 = require(path.join(nm, 'ajv', 'dist', '2020'));
const ajv2020 = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv2020);
const ajvFor = (schema) => (JSON.stringify(schema).includes('"prefixItems"') ? ajv2020 : ajv);

// The constraint of each input record, by id.
const want = new Map();
for (const r of read(inPath)) {
  const id = r.custom_id !== undefined ? r.custom_id : r.id;
  const b = r.body || r;
  let c = null;
  const rf = b.response_format;
  if (rf && rf.type === 'json_schema') c = { kind: 'schema', schema: rf.json_schema.schema };
  else if (rf && rf.type === 'json_object') c = { kind: 'object' };
  else if (b.guided_json !== undefined)
    c = { kind: 'schema', schema: typeof b.guided_json === 'string' ? JSON.parse(b.guided_json) : b.guided_json };
  else if (b.guided_regex !== undefined) c = { kind: 'regex', re: new RegExp('^(?:' + b.guided_regex + ')$', 'u') };
  else if (b.guided_choice !== undefined) c = { kind: 'choice', list: b.guided_choice };
  if (c) want.set(String(id), c);
}

let bad = 0, n = 0;
const kinds = {};
const fail = (id, msg) => {
  bad++;
  console.log(`${id}: ${msg}`);
};
// Every (id, text, finish_reason) of the answers: each choice of an n > 1 record.
const answers = [];
for (const a of read(outPath)) {
  if (a.custom_id !== undefined) {
    for (const ch of a.response.body.choices)
      answers.push([a.custom_id, ch.message ? ch.message.content : ch.text, ch.finish_reason, a.custom_id]);
  } else if (a.choices) {
    for (const ch of a.choices) answers.push([`${a.id}#${ch.index}`, ch.text, ch.finish_reason, String(a.id)]);
  } else {
    answers.push([String(a.id), a.text, a.finish_reason, String(a.id)]);
  }
}
const seen = new Set();
for (const [id, text, finish, rid] of answers) {
  const c = want.get(rid);
  if (!c) continue;
  if (!seen.has(rid)) n++;
  seen.add(rid);
  kinds[c.kind] = (kinds[c.kind] || 0) + 1;
  if (finish !== 'stop') {
    fail(id, `finish_reason ${finish}, text ${JSON.stringify(text)}`);
    continue;
  }
  if (c.kind === 'regex') {
    if (!c.re.test(text)) fail(id, `${JSON.stringify(text)} does not match ${c.re}`);
  } else if (c.kind === 'choice') {
    if (!c.list.includes(text)) fail(id, `${JSON.stringify(text)} is not one of ${JSON.stringify(c.list)}`);
  } else {
    let doc;
    try {
      doc = JSON.parse(text);
    } catch (e) {
      fail(id, `not JSON (${e.message}): ${JSON.stringify(text)}`);
      continue;
    }
    if (c.kind === 'object') {
      if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) fail(id, `not an object: ${text}`);
    } else {
      const a = ajvFor(c.schema);
      const v = a.compile(c.schema);
      if (!v(doc)) fail(id, `${text} fails its schema: ${a.errorsText(v.errors)}`);
    }
  }
}
if (n !== want.size) fail('-', `${n} answers for ${want.size} constrained records`);
console.log(`guided_check: ${n} constrained answers (${JSON.stringify(kinds)}), ${bad} bad`);
process.exit(bad ? 1 : 0);
