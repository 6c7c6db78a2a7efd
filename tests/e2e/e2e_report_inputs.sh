#!/usr/bin/env bash
# tests/e2e/e2e_report_inputs.sh BUILD SRC - issue 24 #8: `tokenmill report` and its inputs.
# 1. -o naming one of the inputs (directly, through a symbolic link, or a file found in an input
#    folder) is refused with exit 2 and the input is left as it was.
# 2. A metrics file with a wrong-typed field (a string TTFT, an array for throughput, a numeric
#    start time string) is skipped with a warning naming the file, the field and the type it
#    should have; the other runs are reported (exit 0). --strict makes it an error (exit 1) with
#    the same words. A JSON file without schema_version in a folder is still passed over quietly.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
command -v node >/dev/null 2>&1 || { echo "skipped: node missing"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

TM_SAMPLE_DIR="$work" "$build/test_metrics" >/dev/null 2>&1
mkdir -p "$work/hist"
node - "$work/metrics.json" "$work/hist" <<'JS'
const fs = require('fs');
const [base, dir] = process.argv.slice(2);
const b = JSON.parse(fs.readFileSync(base, 'utf8'));
const put = (name, edit) => {
  const m = JSON.parse(JSON.stringify(b));
  edit(m);
  fs.writeFileSync(`${dir}/${name}`, JSON.stringify(m, null, 1));
};
for (let k = 0; k < 3; k++)
  put(`run${k}.json`, (m) => { m.time.start_unix_s += 3600 * k; m.time.start_utc = new Date(m.time.start_unix_s * 1000).toISOString().replace(/\.\d+Z$/, 'Z'); });
put('bad_ttft.json', (m) => { m.latency_ms.ttft.p50 = '7.1'; });
fs.writeFileSync(`${dir}/notes.json`, '{"not": "metrics"}\n');
put('../bad_throughput.json', (m) => { m.throughput = [1, 2]; });
JS
good="$work/hist/run0.json"
sum0=$(sha256sum "$good" | cut -c1-64)

# 1. the output is an input
rc=0
"$build/tokenmill" report -o "$good" "$work/hist" >"$work/o1" 2>"$work/e1" || rc=$?
[ "$rc" = 2 ] || fail "-o an input file of a folder: exit $rc, want 2"
grep -q "the output $good is the input .*run0.json; choose another -o" "$work/e1" ||
    fail "-o an input: message: $(cat "$work/e1")"
ln -s "$good" "$work/link.html"
rc=0
"$build/tokenmill" report -o "$work/link.html" "$good" "$work/hist/run1.json" >/dev/null \
    2>"$work/e2" || rc=$?
[ "$rc" = 2 ] || fail "-o a link to an input: exit $rc, want 2"
rc=0
"$build/tokenmill" report -o "$work/hist/../hist/run1.json" "$work/hist/run1.json" \
    >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "-o another spelling of the input: exit $rc, want 2"
[ "$(sha256sum "$good" | cut -c1-64)" = "$sum0" ] || fail "an input was overwritten"
[ ! -e "$work/hist/run0.json.tmp" ] || fail "a temporary file was left"
echo "ok: -o naming an input is refused (exit 2), inputs unchanged"

# 2. wrong-typed files
rc=0
"$build/tokenmill" report -o "$work/r.html" "$work/hist" "$work/bad_throughput.json" \
    >"$work/o3" 2>"$work/e3" || rc=$?
[ "$rc" = 0 ] || fail "a wrong-typed file aborted the report: exit $rc: $(cat "$work/e3")"
grep -q "warning: skipping $work/hist/bad_ttft.json: latency_ms.ttft.p50 is a string, expected a number" \
    "$work/e3" || fail "no warning for bad_ttft.json: $(cat "$work/e3")"
grep -q "warning: skipping $work/bad_throughput.json: throughput is an array, expected an object" \
    "$work/e3" || fail "no warning for bad_throughput.json: $(cat "$work/e3")"
[ "$(grep -c warning "$work/e3")" = 2 ] || fail "warnings: $(cat "$work/e3")"
grep -q "r.html: 3 runs, 1 series" "$work/o3" || fail "report: $(cat "$work/o3")"
grep -q "data-file=\"$work/hist/run2.json\"" "$work/r.html" || fail "run2 missing from the page"
! grep -q "bad_ttft" "$work/r.html" || fail "the skipped file is on the page"
echo "ok: wrong-typed files skipped with warnings naming the field; 3 runs reported"
rc=0
"$build/tokenmill" report --strict -o "$work/s.html" "$work/hist" >/dev/null 2>"$work/e4" || rc=$?
[ "$rc" = 1 ] || fail "--strict: exit $rc, want 1"
grep -q "$work/hist/bad_ttft.json: latency_ms.ttft.p50 is a string, expected a number" \
    "$work/e4" || fail "--strict message: $(cat "$work/e4")"
[ ! -e "$work/s.html" ] || fail "--strict wrote a report"
rm "$work/hist/bad_ttft.json"
"$build/tokenmill" report --strict -o "$work/s.html" "$work/hist" >/dev/null ||
    fail "--strict on good files"
echo "ok: --strict makes it an error (exit 1)"
echo "e2e_report_inputs: ok"
