#!/usr/bin/env node
// tests/oracles/check_report.cjs - check a `tokenmill report` page against the metrics files it was made
// from, with no HTML library: the report marks every number it takes from a file with
// data-src (index into the sources list), data-path (JSON path) and data-value, so:
//   - every marked number's data-value equals the file's value exactly (null shown as a dash);
//   - its shown text is that value rounded to the decimals shown (times data-scale);
//   - every change (data-kind="delta") equals (latest - previous) / previous of the two files;
//   - every chart point carries its file's value;
//   - every run has a card or a table row with each tracked figure, and the page needs nothing
//     from the network (no script, no external URL).
//   node check_report.cjs REPORT.html [--expect-runs N] [--expect-regressions N]
// Prints a summary; exit 0 when everything matches, 1 otherwise.
'use strict';
const fs = require('fs');

const args = process.argv.slice(2);
const file = args[0];
const opt = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? Number(args[i + 1]) : null;
};
const html = fs.readFileSync(file, 'utf8');
let bad = 0;
const fail = (msg) => {
  bad++;
  if (bad <= 30) console.error('check_report: ' + msg);
};

const unesc = (s) =>
  s.replace(/&quot;/g, '"').replace(/&#39;/g, "'").replace(/&lt;/g, '<').replace(/&gt;/g, '>')
    .replace(/&ndash;/g, '\u2013').replace(/&amp;/g, '&');
const attrs = (tag) => {
  const out = {};
  for (const m of tag.matchAll(/([a-zA-Z-]+)="([^"]*)"/g)) out[m[1]] = unesc(m[2]);
  return out;
};

// Sources: <li data-src="i" data-file="path">
const sources = [];
for (const m of html.matchAll(/<li ([^>]*data-file="[^"]*"[^>]*)>/g)) {
  const a = attrs(m[1]);
  sources[Number(a['data-src'])] = JSON.parse(fs.readFileSync(a['data-file'], 'utf8'));
}
if (sources.length === 0) fail('no sources listed');
const at = (doc, path) => path.split('.').reduce((v, k) => (v == null ? undefined : v[k]), doc);

// No network, no script.
if (/<script/i.test(html)) fail('the page has a script');
if (/(src|href)="(https?:)?\/\//i.test(html)) fail('the page refers to a URL');

// Marked numbers: <span class="num" ...>text</span>
let n_num = 0;
const seen = new Set();
for (const m of html.matchAll(/<span class="num" ([^>]*)>([^<]*)<\/span>/g)) {
  n_num++;
  const a = attrs(m[1]);
  const text = unesc(m[2]);
  const src = Number(a['data-src']);
  const path = a['data-path'];
  seen.add(src + ' ' + path);
  const want = at(sources[src], path);
  if (a['data-value'] === 'null') {
    if (want !== null && want !== undefined) fail(`#${src} ${path}: shown as null, file has ${want}`);
    if (text !== '\u2013') fail(`#${src} ${path}: null shown as "${text}"`);
    continue;
  }
  const v = Number(a['data-value']);
  if (v !== want) fail(`#${src} ${path}: data-value ${a['data-value']}, file has ${want}`);
  const shown = Number(text.replace(/,/g, ''));
  const dec = text.includes('.') ? text.length - text.indexOf('.') - 1 : 0;
  const scale = Number(a['data-scale'] || 1);
  if (!/^-?[0-9,]+(\.[0-9]+)?$/.test(text) ||
      Math.abs(shown - want * scale) > 0.5 * 10 ** -dec + 1e-9 * Math.abs(want * scale)) {
    fail(`#${src} ${path}: shown "${text}", file has ${want}${scale !== 1 ? ' x ' + scale : ''}`);
  }
}

// Changes: <span class="delta ..." data-kind="delta" data-src data-prev data-path>+3.2%</span>
let n_delta = 0;
for (const m of html.matchAll(/<span ([^>]*data-kind="delta"[^>]*)>([^<]*)<\/span>/g)) {
  n_delta++;
  const a = attrs(m[1]);
  const cur = at(sources[Number(a['data-src'])], a['data-path']);
  const prev = at(sources[Number(a['data-prev'])], a['data-path']);
  const pct = ((cur - prev) / prev) * 100;
  const shown = Number(m[2].replace('%', ''));
  if (!/^[+-][0-9]+\.[0-9]%$/.test(m[2]) || Math.abs(shown - pct) > 0.05 + 1e-9)
    fail(`delta #${a['data-src']} vs #${a['data-prev']} ${a['data-path']}: shown ${m[2]}, ` +
      `files give ${pct.toFixed(3)}%`);
}

// Chart points.
let n_pts = 0;
for (const m of html.matchAll(/<circle ([^>]*)>/g)) {
  const a = attrs(m[1]);
  if (!('data-src' in a)) continue;
  n_pts++;
  const want = at(sources[Number(a['data-src'])], a['data-path']);
  if (Number(a['data-value']) !== want)
    fail(`point #${a['data-src']} ${a['data-path']}: ${a['data-value']} vs file ${want}`);
}

// Coverage: each run shows each tracked figure.
const figs = ['throughput.output_tok_s', 'throughput.prefill_tok_s', 'throughput.decode_tok_s',
  'latency_ms.ttft.p50', 'latency_ms.ttft.p99', 'latency_ms.tpot.p50', 'latency_ms.e2e.p50'];
sources.forEach((doc, i) => {
  for (const f of figs) if (!seen.has(i + ' ' + f)) fail(`run #${i}: ${f} is not shown`);
  if (doc.schema_version >= 2 && !seen.has(i + ' latency_ms.itl.p50')) fail(`run #${i}: no ITL`);
});

const want_runs = opt('--expect-runs');
if (want_runs !== null && sources.length !== want_runs)
  fail(`${sources.length} runs, expected ${want_runs}`);
const n_reg = (html.match(/<tr class="regressed"><td class="l">/g) || []).length;
const want_reg = opt('--expect-regressions');
if (want_reg !== null && n_reg !== want_reg) fail(`${n_reg} regressions listed, expected ${want_reg}`);

console.log(`check_report: ${file}: ${sources.length} runs, ${n_num} numbers, ${n_delta} changes, ` +
  `${n_pts} chart points, ${n_reg} regressions listed; ${bad} mismatches`);
process.exit(bad ? 1 : 0);
