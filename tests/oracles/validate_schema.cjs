#!/usr/bin/env node
// tests/oracles/validate_schema.cjs - validate JSON documents against a JSON Schema with the pinned ajv
// (third_party/npm/node_modules/ajv, installed by tools/setup). Used by tests/e2e/e2e_schemas.sh.
//
//   node validate_schema.cjs [--jsonl] [--invalid] SCHEMA FILE...
//   node validate_schema.cjs --verdicts SCHEMA TSV
//
// --jsonl    each non-blank line of each FILE is one document
// --invalid  every document must FAIL validation (negative tests)
// --verdicts TSV lines "path<TAB>line<TAB>code" say what the C record parser decided for one input
//            line; the schema must agree: valid iff code is "none", for the codes a schema can
//            judge (none, missing_field, wrong_type, invalid_value; the others need context the
//            schema does not see: duplicates, byte-level UTF-8, line length, JSON syntax).
// The schema is compiled in ajv strict mode (but strictRequired), so unknown keywords are errors.
// Exit status: 0 all as expected, 1 a document did not match the expectation, 2 usage/IO errors.
'use strict';
const fs = require('fs');
const path = require('path');

const modules = path.join(__dirname, '..', '..', 'third_party', 'npm', 'node_modules');
let Ajv;
try {
  Ajv = require(path.join(modules, 'ajv'));
} catch (e) {
  console.error(`validate_schema: ajv not found under ${modules} (run tools/setup)`);
  process.exit(2);
}

const args = process.argv.slice(2);
const jsonl = args.includes('--jsonl');
const verdicts = args.includes('--verdicts');
const expectInvalid = args.includes('--invalid');
const rest = args.filter((a) => !a.startsWith('--'));
if (rest.length < 2) {
  console.error('usage: validate_schema.cjs [--jsonl] [--invalid] SCHEMA FILE... | --verdicts SCHEMA TSV');
  process.exit(2);
}
const [schemaPath, ...files] = rest;

// strictRequired is off for the record schema's oneOf: [{required: [prompt]}, {required: [messages]}].
const ajv = new Ajv({ strict: true, strictRequired: false, allErrors: true });
let validate;
try {
  validate = ajv.compile(JSON.parse(fs.readFileSync(schemaPath, 'utf8')));
} catch (e) {
  console.error(`validate_schema: ${schemaPath}: ${e.message}`);
  process.exit(2);
}

let bad = 0;
let n = 0;
function check(doc, where) {
  n++;
  const ok = validate(doc);
  if (ok && expectInvalid) {
    console.error(`${where}: valid against ${schemaPath}, but it should not be`);
    bad++;
  } else if (!ok && !expectInvalid) {
    const why = validate.errors.map((e) => `${e.instancePath || '/'} ${e.message}` +
      (e.params && e.params.additionalProperty ? ` (${e.params.additionalProperty})` : '')).join('; ');
    console.error(`${where}: ${why}`);
    bad++;
  }
}

if (verdicts) {
  const judged = new Set(['none', 'missing_field', 'wrong_type', 'invalid_value']);
  const cache = new Map();
  for (const row of fs.readFileSync(files[0], 'utf8').split('\n').filter((r) => r)) {
    const [file, lineNo, code] = row.split('\t');
    if (!judged.has(code)) continue;
    if (!cache.has(file)) cache.set(file, fs.readFileSync(file, 'utf8').split('\n'));
    const text = cache.get(file)[Number(lineNo) - 1].replace(/^\uFEFF/, '').replace(/\r$/, '');
    n++;
    const ok = validate(JSON.parse(text));
    if (ok !== (code === 'none')) {
      console.error(`${file}:${lineNo}: parser says ${code}, schema says ${ok ? 'valid' : 'invalid'}`);
      bad++;
    }
  }
  files.length = 0;
}

for (const file of files) {
  let text;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    console.error(`validate_schema: ${file}: ${e.message}`);
    process.exit(2);
  }
  const docs = jsonl ? text.split('\n').map((l, i) => [l, `${file}:${i + 1}`]).filter(([l]) => l.trim())
                     : [[text, file]];
  for (const [t, where] of docs) {
    let doc;
    try {
      doc = JSON.parse(t);
    } catch (e) {
      if (expectInvalid) { n++; continue; } // not even JSON: invalid, as expected
      console.error(`${where}: not JSON: ${e.message}`);
      bad++;
      continue;
    }
    check(doc, where);
  }
}
console.log(`validate_schema: ${path.basename(schemaPath)}: ${n} document(s), ${bad} unexpected`);
process.exit(bad ? 1 : 0);
