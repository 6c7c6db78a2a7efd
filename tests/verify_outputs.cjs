// tests/verify_outputs.cjs OUT_DIR INPUT.jsonl... - the exactly-once oracle of
// ../shared/notes/RELIABILITY.md: every non-blank input line ends in exactly one completion or
// error record; completion ids come from the input and are unique; error records name a file and
// a line that exist; metrics.json counts agree. Prints a summary; exit 1 on any violation.
"use strict";
const fs = require("fs");
const { execFileSync } = require("child_process");

const [outDir, ...inputs] = process.argv.slice(2);
const fail = (msg) => { console.error("verify: " + msg); process.exitCode = 1; };

// Input: per (file, line) the id text as the sink would echo it (JSON of the id), when readable.
const lines = new Map(); // "file:line" -> id json or null
for (const f of inputs) {
  const text = fs.readFileSync(f, "utf8");
  const rows = text.split("\n");
  if (rows[rows.length - 1] === "") rows.pop();
  rows.forEach((row, i) => {
    if (row.trim() === "") return;
    let id = null;
    try { const j = JSON.parse(row); if (j && j.id !== undefined) id = JSON.stringify(j.id); } catch (_) {}
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
  const id = JSON.stringify(c.id);
  const key = firstLineOfId.get(id);
  if (!key) { fail("completion for an id not in the input: " + id); continue; }
  if (!["stop", "length"].includes(c.finish_reason)) fail("bad finish_reason for " + id);
  if (typeof c.text !== "string") fail("no text for " + id);
  bump(key);
}
for (const e of errs) {
  const key = e.file + ":" + e.line;
  if (!lines.has(key)) { fail("error record for a line not in the input: " + key); continue; }
  if (!e.error || !e.error.code || !e.error.message) fail("error record without code/message: " + key);
  bump(key);
}
for (const key of lines.keys()) {
  const n = seen.get(key) || 0;
  if (n !== 1) fail(`${key}: ${n} output records (want exactly 1)`);
}
const m = JSON.parse(fs.readFileSync(outDir + "/metrics.json", "utf8"));
const recs = m.records || {};
if (recs.ok !== comp.length) fail(`metrics records.ok ${recs.ok} != ${comp.length} completions`);
if (recs.failed !== errs.length) fail(`metrics records.failed ${recs.failed} != ${errs.length} errors`);
console.log(`verify: ${lines.size} input records -> ${comp.length} completions + ${errs.length} errors` +
  (process.exitCode ? " (FAILED)" : " (ok)"));
