#!/usr/bin/env node
// tests/gen_bad_lines.cjs - seeded generator of a JSONL input with VALID good records and BAD
// malformed ones (row 10 of ../shared/notes/RELIABILITY.md), and of the oracle's expectations.
//
//   node gen_bad_lines.cjs --valid N --bad M --seed S --out FILE --expect TSV
//        [--name NAME] [--long-bytes B] [--field-bytes F] [--deep D]
//
// FILE gets N valid and M malformed lines in a seeded random order (plus blank lines, which are
// not records), native records and OpenAI Batch lines mixed. TSV gets "NAME:LINE<TAB>CODE" for
// every malformed line, the error code tokenmill must give it (NAME defaults to FILE: the name
// the job's error records will use). The job that reads FILE must set limits.max_line_bytes <
// B (one line of B bytes is made; default 1.5 MiB, for a limit of 1 MiB) and
// limits.max_field_bytes < F (default 70,000, for a limit of 65,536) and keep limits.max_depth
// (64) < D (default 100,000 nested '[').
//
// Malformed kinds: JSONTestSuite-style syntax errors, invalid UTF-8 (bad byte, overlong, cut
// sequence, encoded surrogate), a BOM not at the file start, raw NUL and \u0000, deep nesting,
// 1e99999, 2^64+1, duplicate keys, wrong types, out-of-range values, missing id / custom_id,
// duplicate id / custom_id, unsupported OpenAI requests (best_of, stream, /v1/embeddings), an
// over-long line, an over-long field. Valid lines exercise a BOM at the file start, CRLF endings
// and a last line without a newline.
"use strict";
const fs = require("fs");

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
const nValid = +args.valid, nBad = +args.bad, seed = +(args.seed || 1);
const longBytes = +(args["long-bytes"] || 1.5 * 1024 * 1024);
const fieldBytes = +(args["field-bytes"] || 70000);
const deep = +(args.deep || 100000);
if (!(nValid >= 1) || !(nBad >= 0) || !args.out || !args.expect) {
  console.error("usage: gen_bad_lines.cjs --valid N --bad M --seed S --out FILE --expect TSV [--name NAME]");
  process.exit(2);
}
const name = args.name || args.out;

// xorshift64*: a fixed seed gives the same file on every machine.
let state = BigInt(seed) * 0x9e3779b97f4a7c15n + 1n;
const mask = (1n << 64n) - 1n;
function rnd() {
  state ^= state >> 12n; state ^= (state << 25n) & mask; state ^= state >> 27n;
  return Number(((state * 0x2545f4914f6cdd1dn) & mask) >> 11n) / 2 ** 53;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];
const B = (s) => Buffer.from(s, "utf8");
const words = ["alpha", "beta", "gamma", "delta", "river", "stone", "light", "cloud", "seven", "paper"];
const text = (n) => Array.from({ length: n }, () => pick(words)).join(" ");

const validIds = []; // JSON id texts of valid records so far (for duplicates)
const validCids = [];
let nV = 0;
function validLine() {
  const k = nV++;
  const r = rnd();
  if (r < 0.35) { validIds.push(`v${k}`); return B(JSON.stringify({ id: `v${k}`, prompt: text(3), seed: k })); }
  if (r < 0.5) { validIds.push(k); return B(JSON.stringify({ id: k, messages: [{ role: "user", content: text(4) }], temperature: 0 })); }
  validCids.push(`o${k}`);
  if (r < 0.8)
    return B(JSON.stringify({ custom_id: `o${k}`, method: "POST", url: "/v1/chat/completions",
      body: { model: "tiny", messages: [{ role: "user", content: text(3) }], max_tokens: 1, seed: k } }));
  return B(JSON.stringify({ custom_id: `o${k}`, method: "POST", url: "/v1/completions",
    body: { model: "tiny", prompt: text(3), max_completion_tokens: 1 } }));
}

// Each kind: [code, make(id) -> Buffer]. id is unique to the line.
const kinds = [
  ["invalid_json", (id) => B(`{"id":"${id}","prompt":"x",}`)],
  ["invalid_json", (id) => B(`{'id':'${id}','prompt':'x'}`)],
  ["invalid_json", (id) => B(`{"id":"${id}" "prompt":"x"}`)],
  ["invalid_json", (id) => B(`{"id":"${id}","prompt":"x"`)],
  ["invalid_json", (id) => B(`{"id":"${id}","prompt":"unterminated}`)],
  ["invalid_json", (id) => B(`{"id":"${id}","prompt":"x","t":NaN}`)],
  ["invalid_json", (id) => B(`{"id":"${id}","prompt":"x","n":01}`)],
  ["invalid_json", (id) => B(`{"id":"${id}","prompt":"bad \\q escape"}`)],
  ["invalid_json", (id) => B(`{"id":"${id}","prompt":"x","n":-}`)],
  ["invalid_json", (id) => B(`{"id":"${id}","prompt":"x","n":1.}`)],
  ["invalid_json", (id) => B(`{"id":"${id}","prompt":"lone \\ud800 surrogate"}`)],
  ["invalid_json", (id) => B(`{"id":"${id}","prompt":"x"}{"id":"${id}b"}`)],
  ["invalid_json", () => B("tru")],
  ["invalid_json", (id) => B(`{"id":"${id}","prompt":"x","meta":1e99999}`)],
  ["invalid_json", () => B(`{"id":18446744073709551617,"prompt":"x"}`)],
  ["invalid_json", (id) => B(`{"id":"${id}","prompt":"x","prompt":"y"}`)],
  ["invalid_json", (id) => Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), B(`{"id":"${id}","prompt":"bom"}`)])],
  ["invalid_json", (id) => Buffer.concat([B(`{"id":"${id}","prompt":"nul`), Buffer.from([0]), B(`"}`)])],
  ["invalid_json", (id) => B(`{"id":"${id}","prompt":"esc \\u0000 nul"}`)],
  ["invalid_utf8", (id) => Buffer.concat([B(`{"id":"${id}","prompt":"a`), Buffer.from([0xff]), B(`b"}`)])],
  ["invalid_utf8", (id) => Buffer.concat([B(`{"id":"${id}","prompt":"a`), Buffer.from([0xc0, 0xaf]), B(`"}`)])],
  ["invalid_utf8", (id) => Buffer.concat([B(`{"id":"${id}","prompt":"a`), Buffer.from([0xe4, 0xb8]), B(`"}`)])],
  ["invalid_utf8", (id) => Buffer.concat([B(`{"id":"${id}","prompt":"a`), Buffer.from([0xed, 0xa0, 0x80]), B(`"}`)])],
  ["nesting_too_deep", (id) => B(`{"id":"${id}","prompt":"x","meta":${"[".repeat(deep)}${"]".repeat(deep)}}`)],
  ["wrong_type", (id) => B(`{"id":"${id}","prompt":42}`)],
  ["wrong_type", (id) => B(`{"id":"${id}","prompt":"x","temperature":"hot"}`)],
  ["wrong_type", () => B(`{"id":1.5,"prompt":"x"}`)],
  ["wrong_type", (id) => B(`{"id":"${id}","messages":"hi"}`)],
  ["wrong_type", (id) => B(`["${id}","x"]`)],
  ["wrong_type", (id) => B(JSON.stringify({ custom_id: id, method: "POST", url: "/v1/completions", body: "x" }))],
  ["invalid_value", (id) => B(`{"id":"${id}","prompt":"x","temperature":-1}`)],
  ["invalid_value", (id) => B(`{"id":"${id}","prompt":"x","max_tokens":-1}`)],
  ["invalid_value", (id) => B(JSON.stringify({ custom_id: id, method: "GET", url: "/v1/completions", body: {} }))],
  ["missing_field", () => B(`{"prompt":"no id"}`)],
  ["missing_field", (id) => B(`{"id":"${id}"}`)],
  ["missing_field", () => B(JSON.stringify({ method: "POST", url: "/v1/completions", body: { model: "m", prompt: "x" } }))],
  ["missing_field", (id) => B(JSON.stringify({ custom_id: id, method: "POST", url: "/v1/chat/completions", body: { messages: [] } }))],
  ["duplicate_id", () => validIds.length ? B(JSON.stringify({ id: pick(validIds), prompt: "again" })) : null],
  ["duplicate_id", () => validCids.length ? B(JSON.stringify({ custom_id: pick(validCids), method: "POST",
    url: "/v1/completions", body: { model: "m", prompt: "again" } })) : null],
  ["unsupported", (id) => B(JSON.stringify({ custom_id: id, method: "POST", url: "/v1/chat/completions",
    body: { model: "m", messages: [{ role: "user", content: "x" }], best_of: 3 } }))],
  ["unsupported", (id) => B(JSON.stringify({ custom_id: id, method: "POST", url: "/v1/chat/completions",
    body: { model: "m", messages: [{ role: "user", content: "x" }], stream: true } }))],
  ["unsupported", (id) => B(JSON.stringify({ custom_id: id, method: "POST", url: "/v1/embeddings", body: { model: "m", input: "x" } }))],
];
const once = [ // exactly one line each
  ["line_too_long", (id) => B(`{"id":"${id}","prompt":"${"z".repeat(longBytes)}"}`)],
  ["field_too_large", (id) => B(`{"id":"${id}","prompt":"${"y".repeat(fieldBytes)}"}`)],
];

// Order: a random interleaving of valid and bad lines; the first line is valid (with a BOM).
const total = nValid + nBad;
const isBad = new Array(total).fill(false);
let placed = 0;
while (placed < nBad) {
  const i = 1 + Math.floor(rnd() * (total - 1));
  if (!isBad[i]) { isBad[i] = true; placed++; }
}
const out = fs.openSync(args.out, "w");
const expect = [];
let line = 0, nBadMade = 0;
const w = (buf) => fs.writeSync(out, buf);
for (let i = 0; i < total; i++) {
  if (i > 0 && rnd() < 0.01) { w(B(rnd() < 0.5 ? "\n" : "  \t\r\n")); line++; } // blank lines
  let buf, code = null;
  if (!isBad[i]) {
    buf = validLine();
    if (i === 0) buf = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), buf]);
  } else {
    const id = `b${i}`;
    if (nBadMade < once.length) [code, buf] = [once[nBadMade][0], once[nBadMade][1](id)];
    while (!buf) { const k = pick(kinds); code = k[0]; buf = k[1](id); }
    nBadMade++;
  }
  line++;
  if (code) expect.push(`${name}:${line}\t${code}`);
  w(buf);
  if (i < total - 1) w(B(rnd() < 0.1 ? "\r\n" : "\n")); // the last line has no newline
}
fs.closeSync(out);
fs.writeFileSync(args.expect, expect.join("\n") + "\n");
console.log(`gen_bad_lines: ${nValid} valid + ${nBad} malformed lines (${line} lines) -> ${args.out}`);
