#!/usr/bin/env bash
# tests/e2e/e2e_schemas.sh BUILD_DIR SOURCE_DIR - the schemas in schemas/ are valid (ajv strict mode)
# and agree with the code: every jobs/*.json and the fixture job validate against job.schema.json
# (and typo'd copies do not); the good lines of the JSONL fixture validate against
# record.schema.json; the sample outputs written by test_sink_lz4 and test_metrics validate
# against output/error/metrics schemas; the canonical spec test_job_spec checks is covered by
# the same schema. Skips (77) when node or the pinned ajv is missing.
set -euo pipefail
build=${1:?build dir}
src=${2:?source dir}
v="$src/tests/oracles/validate_schema.cjs"
if ! command -v node >/dev/null 2>&1 || [ ! -d "$src/third_party/npm/node_modules/ajv" ]; then
    echo "skipped: node or third_party/npm/node_modules/ajv missing (run tools/setup)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
run() { node "$v" "$@" || fail=1; }

# Every schema compiles in strict mode (validated against an empty list of documents... by one
# trivially checked document each: the schema file itself must at least be JSON).
for s in "$src"/schemas/*.schema.json; do
    echo '{}' >"$tmp/empty.json"
    node "$v" --invalid "$s" "$tmp/empty.json" >/dev/null 2>"$tmp/err" || {
        # "{}" may be valid for some schemas; only a compile error (exit 2) is fatal here.
        [ $? -eq 2 ] && { cat "$tmp/err"; fail=1; }
    }
done

# Job specs: the shipped examples and the fixture.
shopt -s nullglob
jobs=("$src"/jobs/*.json "$src"/tests/fixtures/jsonl/job.json)
run "$src/schemas/job.schema.json" "${jobs[@]}"
# A typo anywhere is rejected by the schema, as it is by the loader.
node -e '
const fs = require("fs");
const j = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
const bad = [
  Object.assign({}, j, {modle: "x"}),
  Object.assign({}, j, {engine: Object.assign({}, j.engine, {max_sqes: 8})}),
  Object.assign({}, j, {engine: Object.assign({}, j.engine, {max_seqs: "8"})}),
  Object.assign({}, j, {engine: Object.assign({}, j.engine, {block_size: 100})}),
  Object.assign({}, j, {defaults: Object.assign({}, j.defaults, {temperature: "hot"})}),
  Object.assign({}, j, {defaults: Object.assign({}, j.defaults, {top_p: 0})}),
  Object.assign({}, j, {input: {files: []}}),
];
fs.writeFileSync(process.argv[2], bad.map((b) => JSON.stringify(b)).join("\n") + "\n");
' "$src/tests/fixtures/jsonl/job.json" "$tmp/bad_jobs.jsonl"
run --jsonl --invalid "$src/schemas/job.schema.json" "$tmp/bad_jobs.jsonl"

# Input records: the fixture's good lines (1, 2, 12, 33) are valid; a few bad ones are not.
sed -n '1p;2p;12p;33p' "$src/tests/fixtures/jsonl/mixed.jsonl" | sed '1s/^\xef\xbb\xbf//' | tr -d '\r' >"$tmp/good.jsonl"
echo >>"$tmp/good.jsonl"
run --jsonl "$src/schemas/record.schema.json" "$tmp/good.jsonl"
sed -n '13,27p;31,32p' "$src/tests/fixtures/jsonl/mixed.jsonl" >"$tmp/bad.jsonl"
run --jsonl --invalid "$src/schemas/record.schema.json" "$tmp/bad.jsonl"

# The C record parser and record.schema.json agree on every line of the fixture and of jobs/data
# (test_jsonl writes its verdicts).
if [ -x "$build/test_jsonl" ]; then
    mkdir -p "$tmp/verdicts"
    TM_SRC="$src" TM_SAMPLE_DIR="$tmp/verdicts" "$build/test_jsonl" >/dev/null 2>&1 || { echo "test_jsonl failed"; fail=1; }
    run --verdicts "$src/schemas/record.schema.json" "$tmp/verdicts/verdicts.tsv"
fi

# Outputs written by the unit tests' sample writers.
samples="$tmp/samples"
mkdir -p "$samples"
have_samples=0
if [ -x "$build/test_sink_lz4" ]; then
    TM_SRC="$src" TM_SAMPLE_DIR="$samples" "$build/test_sink_lz4" >/dev/null 2>&1 || { echo "test_sink_lz4 failed"; fail=1; }
    lz4 -q -dc "$samples/completions.jsonl.lz4" >"$samples/completions.jsonl"
    run --jsonl "$src/schemas/output.schema.json" "$samples/completions.jsonl"
    run --jsonl "$src/schemas/error.schema.json" "$samples/errors.jsonl"
    have_samples=1
fi
if [ -x "$build/test_metrics" ]; then
    TM_SRC="$src" TM_SAMPLE_DIR="$samples" "$build/test_metrics" >/dev/null 2>&1 || { echo "test_metrics failed"; fail=1; }
    run "$src/schemas/metrics.schema.json" "$samples/metrics.json" "$samples/metrics-empty.json"
    have_samples=1
fi
[ $have_samples -eq 1 ] || echo "note: test_sink_lz4/test_metrics not built; output samples not checked"

# A real run's outputs, if a demo run left them (make demo).
for d in "$src"/out/*/; do
    [ -f "$d/completions.jsonl.lz4" ] && { lz4 -q -dc "$d/completions.jsonl.lz4" >"$tmp/run.jsonl"; run --jsonl "$src/schemas/output.schema.json" "$tmp/run.jsonl"; }
    [ -s "$d/errors.jsonl" ] && run --jsonl "$src/schemas/error.schema.json" "$d/errors.jsonl"
    [ -f "$d/metrics.json" ] && run "$src/schemas/metrics.schema.json" "$d/metrics.json"
done

exit $fail
