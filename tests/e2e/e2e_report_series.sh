#!/usr/bin/env bash
# tests/e2e/e2e_report_series.sh BUILD SRC - report series keyed by job (issue 36): one-command
# jobs are named by their output folder (or --name / output.job_name), so a 2-record job and a
# 6-record job are two series, not one compared as a regression; plurals agree ("1 run"); and
# rendered at 1280 px wide (headless chromium) no element of the report is cut off (its content
# wider than its box).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "e2e_report_series: $*" >&2; exit 1; }
cd "$work"
ln -s "$src/models" models
printf '{"id":"a","prompt":"def f(x):\\n"}\n{"id":"b","prompt":"import os\\n"}\n' >small.jsonl
for i in 1 2 3 4 5 6; do printf '{"id":"r%d","prompt":"def g%d(x):\\n"}\n' $i $i; done >big.jsonl
m=(--model models/demo-pystdlib --max-tokens 8 --temperature 0)
"$build/tokenmill" -q run "${m[@]}" -i small.jsonl -o out/small >/dev/null
"$build/tokenmill" -q run "${m[@]}" -i big.jsonl -o out/big >/dev/null
"$build/tokenmill" -q run "${m[@]}" -i big.jsonl -o out/named --name "nightly eval" >/dev/null
python3 - <<'PY' || fail "metrics job names"
import json
names = [json.load(open(f"out/{d}/metrics.json"))["job"] for d in ("small", "big", "named")]
assert names == ["out/small", "out/big", "nightly eval"], names
PY
"$build/tokenmill" report -o one.html out/small/metrics.json >one.txt
grep -q ': 1 run, 1 series' one.txt || fail "plural: $(cat one.txt)"
grep -q '>1 run<' one.html || fail "plural in the page"
"$build/tokenmill" report -o all.html out >all.txt
grep -q ': 3 runs, 3 series, 0 regressions' all.txt || fail "series: $(cat all.txt)"
for s in 'out/small &middot; ' 'out/big &middot; ' 'nightly eval &middot; '; do
    grep -qF "$s" all.html || fail "no series '$s'"
done
chromium=$(command -v chromium || command -v chromium-browser || true)
[ -n "$chromium" ] || { echo "e2e_report_series: ok (chromium missing: the 1280 px check skipped)"; exit 0; }
# at 1280 px: every element's content fits its box (a wide table would need a scroll bar)
python3 - <<'PY'
probe = ('<script>addEventListener("load", () => { const c = [];'
         ' for (const e of document.querySelectorAll("body *"))'
         '   if (e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== "visible")'
         '     c.push(e.tagName + "." + e.className + ":" + e.scrollWidth + ">" + e.clientWidth);'
         ' document.body.setAttribute("data-clipped", c.length ? c.join(" ") : "none"); })'
         '</script></body>')
open("probe.html", "w").write(open("all.html").read().replace("</body>", probe))
PY
timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$work/chrome" --window-size=1280,2000 --dump-dom "file://$work/probe.html" \
    >dom.html 2>chrome.log || { tail -5 chrome.log; fail "chromium"; }
clipped=$(sed -n 's/.*data-clipped="\([^"]*\)".*/\1/p' dom.html)
[ "$clipped" = none ] || fail "cut off at 1280 px: ${clipped:-no probe result}"
echo "e2e_report_series: ok (3 series, 1 run / 3 runs, nothing cut off at 1280 px)"
