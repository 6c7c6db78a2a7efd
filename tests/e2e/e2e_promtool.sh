#!/usr/bin/env bash
# tests/e2e/e2e_promtool.sh BUILD SRC - the Prometheus textfile of a real job (records ok and
# failed, n-gram speculative decoding on, so every metric is there) passes `promtool check
# metrics` (Debian's prometheus package, installed by tools/setup): counters named _total,
# gauges not, HELP and TYPE for each. Skipped (77) without promtool.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
command -v promtool >/dev/null || { echo "no promtool (tools/setup installs prometheus)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "e2e_promtool: $*" >&2; exit 1; }
cd "$work"
ln -s "$src/models" models
printf '{"id":"a","prompt":"def f(x):\\n    return f(x)\\n\\ndef f(x):\\n"}\n{"id":"b","prompt":"x","max_tokens":-1}\n' >in.jsonl
"$build/tokenmill" -q run --model models/demo-pystdlib -i in.jsonl -o out --max-tokens 16 \
    --prometheus-textfile m.prom --set engine.speculative='{"method":"ngram","num_speculative_tokens":3}' \
    >/dev/null
for m in tokenmill_records_done_total tokenmill_records_failed_total tokenmill_records_in_job \
         tokenmill_completion_tokens_total tokenmill_spec_decode_num_drafts_total; do
    grep -q "^$m{" m.prom || fail "no $m: $(cat m.prom)"
done
grep -q '^# TYPE tokenmill_records_done_total counter$' m.prom || fail "records_done_total type"
grep -q '^# TYPE tokenmill_eta_seconds gauge$' m.prom || fail "eta type"
out=$(promtool check metrics <m.prom 2>&1) || fail "promtool check metrics: $out"
[ -z "$out" ] || fail "promtool check metrics: $out"
echo "e2e_promtool: ok ($(grep -c '^tokenmill_' m.prom) metrics, promtool clean)"
