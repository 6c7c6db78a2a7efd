#!/usr/bin/env bash
# tests/e2e/e2e_report.sh BUILD SRC - `tokenmill report` on a made-up three-night history, rendered in
# headless Chromium. The history is built from the metrics.json that test_metrics writes (so it
# follows the current writer), with three nights of W1, W8 and P whose figures move: on the last
# night W8's output tok/s drops 20% and W1's TTFT p50 rises 30% (two regressions), P's prefill
# gets 10% faster (an improvement, not flagged). The first night's W1 is a schema_version 1 file
# and a JSON file that is not metrics sits in the folder (skipped). Checks: every number on the
# page equals its file's (tests/oracles/check_report.cjs); Chromium's DOM has the title, the regressions
# with their sizes and a card per run; the screenshot is a real PNG, large, with many colours and
# the series' colours in it. Skips (77) without node, and without Chromium after the checks that
# need no browser.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
command -v node >/dev/null 2>&1 || { echo "skipped: node missing"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

TM_SAMPLE_DIR="$work" "$build/test_metrics" >/dev/null 2>&1
mkdir -p "$work/hist"
node - "$work/metrics.json" "$work/hist" <<'JS'
const fs = require('fs');
const [base, dir] = process.argv.slice(2);
const b = JSON.parse(fs.readFileSync(base, 'utf8'));
const nights = ['2026-11-28', '2026-11-29', '2026-11-30'];
const wl = { W1: [1, 512, 256], W8: [8, 512, 256], P: [8, 2048, 1] };
let k = 0;
nights.forEach((day, n) => {
  for (const [w, [seqs, p, g]] of Object.entries(wl)) {
    const m = JSON.parse(JSON.stringify(b));
    const t0 = Date.parse(`${day}T02:00:00Z`) / 1000 + 60 * k++;
    m.time.start_unix_s = t0;
    m.time.end_unix_s = t0 + 30;
    m.time.start_utc = new Date(t0 * 1000).toISOString().replace(/\.\d+Z$/, 'Z');
    m.time.end_utc = new Date((t0 + 30) * 1000).toISOString().replace(/\.\d+Z$/, 'Z');
    m.bench = { workload: w, scale: 'full', seqs, prompt_tokens: p, gen_tokens: g,
                shared_prefix_tokens: 0, seed: 1 };
    m.model.path = '/models/llama-1b';
    m.settings.backend = 'cuda';
    // 1% noise on the first night, then the planted changes on the last night
    const wiggle = n === 0 ? 1.01 : 1;
    const tp = m.throughput, lat = m.latency_ms;
    tp.output_tok_s = { W1: 700, W8: 4000, P: 30 }[w] * wiggle;
    tp.prefill_tok_s = { W1: 70000, W8: 90000, P: 100000 }[w] * wiggle;
    tp.decode_tok_s = w === 'P' ? null : { W1: 740, W8: 4100 }[w] * wiggle;
    lat.ttft.p50 = { W1: 7.1, W8: 48, P: 165 }[w] * wiggle;
    if (n === 2 && w === 'W8') tp.output_tok_s *= 0.8;
    if (n === 2 && w === 'W1') lat.ttft.p50 *= 1.3;
    if (n === 2 && w === 'P') tp.prefill_tok_s *= 1.1;
    if (n === 2) // what NVML gives on a GPU machine (values from an H200)
      m.host.gpus = { count: 1, name: 'NVIDIA H200', driver: '580.159.04', devices: [
        { index: 0, name: 'NVIDIA H200', power_w_mean: 612.34, power_w_max: 690.1,
          energy_j: 18369.2, power_samples: 30 }] };
    if (n === 0 && w === 'W1') { // an old version-1 file
      m.schema_version = 1;
      delete m.job; delete m.bench; delete m.time.start_unix_s; delete m.time.end_unix_s;
      delete m.latency_ms.itl; delete m.host.gpus;
      m.job_note = 'v1';
    }
    fs.writeFileSync(`${dir}/${day}T0200Z-${w}.json`, JSON.stringify(m, null, 2));
  }
});
fs.writeFileSync(`${dir}/notes.json`, '{"not": "metrics"}\n');
JS
# The version-1 W1 file has no bench section: it is its own series ("job"), so W1's series starts
# on the second night. Regressions: W8 output and W1 TTFT p50.
"$build/tokenmill" report --title "tokenmill nightly (test)" -o "$work/report.html" "$work/hist" \
    >"$work/report.out"
grep -q "9 runs" "$work/report.out" || { cat "$work/report.out"; exit 1; }
set +e
"$build/tokenmill" report --fail-on-regression -o "$work/r2.html" "$work/hist" >/dev/null
[ $? -eq 3 ] || { echo "--fail-on-regression did not exit 3"; exit 1; }
"$build/tokenmill" report -o "$work/r3.html" "$work/hist/notes.json" 2>/dev/null
[ $? -eq 1 ] || { echo "a named non-metrics file was not refused"; exit 1; }
set -e
node "$src/tests/oracles/check_report.cjs" "$work/report.html" --expect-runs 9 --expect-regressions 2

chromium=$(command -v chromium || command -v chromium-browser || true)
[ -n "$chromium" ] || { echo "skipped: chromium missing (tools/setup installs it)"; exit 77; }

flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
       --disable-background-networking --disable-component-update --disable-sync
       --user-data-dir="$work/chrome" --window-size=1400,2600)
timeout 120 "$chromium" "${flags[@]}" --dump-dom "file://$work/report.html" \
    >"$work/dom.html" 2>"$work/chrome.log" || { tail -5 "$work/chrome.log"; exit 1; }
for want in "tokenmill nightly (test)" "2 regressions in the latest runs" "Regressions" \
            "W8 · cuda · llama-1b" "W1 · cuda · llama-1b" "-20.0%" "+30.0%" "+10.0%" \
            "Trends" "All runs" "Output throughput (tok/s)" "TTFT p50 (ms)" \
            "× NVIDIA H200" ">612.3</span> W mean" ">18,369</span> J"; do
    grep -qF -- "$want" "$work/dom.html" || { echo "rendered page lacks: $want"; exit 1; }
done
n_cards=$(grep -o '<article class="card' "$work/dom.html" | wc -l)
[ "$n_cards" -eq 9 ] || { echo "$n_cards cards, expected 9"; exit 1; }

timeout 120 "$chromium" "${flags[@]}" --screenshot="$work/shot.png" "file://$work/report.html" \
    >/dev/null 2>>"$work/chrome.log" || { tail -5 "$work/chrome.log"; exit 1; }
[ -s "$work/shot.png" ] || { echo "no screenshot"; exit 1; }
size=$(stat -c %s "$work/shot.png")
[ "$size" -gt 50000 ] || { echo "screenshot is only $size bytes"; exit 1; }
# Series colours (first three of the palette) and the regression red must be on the page.
stats=$(node "$src/tests/oracles/png_stats.cjs" "$work/shot.png" '#2563eb' '#dc2626' '#16a34a' '#c62828')
echo "screenshot: $size bytes, $stats"
node -e '
const s = JSON.parse(process.argv[1]);
const bad = [];
if (s.width !== 1400 || s.height !== 2600) bad.push(`size ${s.width}x${s.height}`);
if (s.colors < 200) bad.push(`only ${s.colors} colours`);
for (const [c, n] of Object.entries(s.has)) if (n < 20) bad.push(`${c}: ${n} pixels`);
if (bad.length) { console.error("screenshot: " + bad.join(", ")); process.exit(1); }
' "$stats"
if [ -n "${TM_REPORT_KEEP:-}" ]; then
    mkdir -p "$TM_REPORT_KEEP" && cp "$work/report.html" "$work/shot.png" "$TM_REPORT_KEEP/"
fi
echo "e2e_report: ok"
