// tests/oracles/verify_outputs.cjs [--expect TSV] [--no-metrics] OUT_DIR INPUT.jsonl... - the
// exactly-once oracle of docs/RELIABILITY.md: every non-blank input line ends in
// exactly one completion or error record; completion ids come from the input and are unique;
// error records name a file and a line that exist; metrics.json counts agree. Native and OpenAI
// Batch lines (custom_id; answered in the OpenAI output/error shape) are both understood.
// INPUT may be NAME=PATH when the job named the file differently (e.g. -=data.jsonl for stdin).
// --expect TSV: lines "FILE:LINE<TAB>CODE": exactly these lines must be error records, each with
// that code. Prints a summary; exit 1 on any violation.
"use strict";
const fs = require("fs");
const { execFileSync } = require("child_process");

const argv = process.argv.slice(2);
let expectPath = null, checkMetrics = true;
while (argv.length && argv[0].startsWith("--")) {
  const a = argv.shift();
  if (a === "--expect") expectPath = argv.shift();
  else if (a === "--no-metrics") checkMetrics = false;
  else { console.error("verify: unknown option " + a); process.exit(2); }
}
const [outDir, ...inputs] = argv;
const isOpenAI = (j) => j && typeof j === "object" && !Array.isArray(j) &&
  ("custom_id" in j || "body" in j || "url" in j);
const fail = (msg) => { console.error("verify: " + msg); process.exitCode = 1; };

// Input: per (file, line) the id text as the sink would echo it (JSON of the id), when readable.
const lines = new Map(); // "file:line" -> id json or null
for (const arg of inputs) {
  const eq = arg.indexOf("=");
  const f = eq > 0 ? arg.slice(0, eq) : arg;
  const text = fs.readFileSync(eq > 0 ? arg.slice(eq + 1) : arg, "latin1"); // bytes, not UTF-8
  const rows = text.split("\n");
  if (rows[rows.length - 1] === "") rows.pop();
  rows.forEach((row, i) => {
    if (/^[ \t\r]*$/.test(row) || (i === 0 && /^\xef\xbb\xbf[ \t\r]*$/.test(row))) return;
    let id = null;
    try {
      const r = i === 0 ? row.replace(/^\xef\xbb\xbf/, "") : row; // a BOM only at the file start
      const j = JSON.parse(Buffer.from(r, "latin1").toString("utf8"));
      if (isOpenAI(j)) { if (typeof j.custom_id === "string") id = JSON.stringify(j.custom_id); }
      else if (j && j.id !== undefined) id = JSON.stringify(j.id);
    } catch (_) {}
    lines.set(f + ":" + (i + 1), id);
  });
}

const comp = execFileSync("lz4", ["-dc", outDir + "/completions.jsonl.lz4"], { maxBuffer: 1 << 30 })
  .toString("utf8").split("\n").filter((l) => l !== "").map((l) => JSON.parse(l));
const errPath = outDir + "/errors.jsonl";
const errs = fs.existsSync(errPath)
  ? fs.readFileSync(errPath, "utf8").split("\n").filter((l) => l !== "").map((l) => JSON.parse(l)) : [];

// Ids of accepted input lines: the first occurrence of each id (later duplicates are errors).
const firstLineOfId = new Map();
for (const [key, id] of lines) if (id !== null && !firstLineOfId.has(id)) firstLineOfId.set(id, key);

const seen = new Map(); // "file:line" -> count
const bump = (key) => seen.set(key, (seen.get(key) || 0) + 1);
for (const c of comp) {
  const oai = c.response !== undefined;
  const id = JSON.stringify(oai ? c.custom_id : c.id);
  const key = firstLineOfId.get(id);
  if (!key) { fail("completion for an id not in the input: " + id); continue; }
  const choice = oai && c.response && c.response.body && c.response.body.choices &&
    c.response.body.choices[0];
  const finish = oai ? choice && choice.finish_reason : c.finish_reason;
  const text = oai ? choice && (choice.message ? choice.message.content : choice.text) : c.text;
  if (oai && (c.response.status_code !== 200 || c.error !== null)) fail("OpenAI answer not 200 for " + id);
  if (!["stop", "length"].includes(finish)) fail("bad finish_reason for " + id);
  if (typeof text !== "string") fail("no text for " + id);
  bump(key);
}
const errCode = (e) => e.error ? e.error.code
  : e.response && e.response.body && e.response.body.error && e.response.body.error.code;
const errMsg = (e) => e.error ? e.error.message
  : e.response && e.response.body && e.response.body.error && e.response.body.error.message;
for (const e of errs) {
  const key = e.file + ":" + e.line;
  if (!lines.has(key)) { fail("error record for a line not in the input: " + key); continue; }
  if (!errCode(e) || !errMsg(e)) fail("error record without code/message: " + key);
  bump(key);
}
if (expectPath) {
  const want = new Map(fs.readFileSync(expectPath, "utf8").split("\n").filter(Boolean)
    .map((l) => l.split("\t")));
  const got = new Map(errs.map((e) => [e.file + ":" + e.line, errCode(e)]));
  for (const [key, code] of want)
    if (got.get(key) !== code) fail(`${key}: want error ${code}, got ${got.get(key) || "a completion"}`);
  for (const key of got.keys()) if (!want.has(key)) fail(`${key}: unexpected error ${got.get(key)}`);
}
for (const key of lines.keys()) {
  const n = seen.get(key) || 0;
  if (n !== 1) fail(`${key}: ${n} output records (want exactly 1)`);
}
if (checkMetrics) {
  const m = JSON.parse(fs.readFileSync(outDir + "/metrics.json", "utf8"));
  const recs = m.records || {};
  if (recs.ok !== comp.length) fail(`metrics records.ok ${recs.ok} != ${comp.length} completions`);
  if (recs.failed !== errs.length) fail(`metrics records.failed ${recs.failed} != ${errs.length} errors`);
}
console.log(`verify: ${lines.size} input records -> ${comp.length} completions + ${errs.length} errors` +
  (process.exitCode ? " (FAILED)" : " (ok)"));
