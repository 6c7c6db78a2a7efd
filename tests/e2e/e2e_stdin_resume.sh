#!/usr/bin/env bash
# tests/e2e/e2e_stdin_resume.sh BUILD SRC - resuming a job that reads standard input ("-", issue
# 24 #4 and issue 23): the manifest keeps a fingerprint of the stream's committed prefix, so
#   - killed (kill -9) mid-run and rerun with another stream: refused before anything is written
#     (every output file unchanged), the message says why;
#   - rerun with the same stream: finishes, every record answered exactly once;
#   - a finished stdin job is never "already finished": rerun with the same stream followed by new
#     lines answers only the new lines (exactly once over the whole stream); rerun with the same
#     stream again answers nothing new; a shorter or different stream is refused.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$src/tests/e2e/durable_lib.sh"
dur_setup 600
out="$work/out"
sed -i 's|"files": \["data/in.jsonl"\]|"files": ["-"]|' "$work/job.json"
head -n 400 "$work/data/in.jsonl" >"$work/a.jsonl" # the first stream
tail -n +401 "$work/data/in.jsonl" >"$work/b.jsonl" # lines that come later
cat "$work/a.jsonl" "$work/b.jsonl" >"$work/ab.jsonl"
sed 's/crash test/other test/' "$work/a.jsonl" >"$work/other.jsonl" # same shape, other bytes
fail() { echo "FAIL: $*"; cat "$work/run.log"; exit 1; }
run_in() { # STREAM ARGS...: tokenmill reads STREAM on standard input; sets rc
    local f=$1
    shift
    rc=0
    "$build/tokenmill" -q run "$@" "$work/job.json" <"$f" >"$work/run.log" 2>&1 || rc=$?
}
sums() { (cd "$out" && sha256sum completions.jsonl.lz4 errors.jsonl manifest.json metrics.json 2>/dev/null || true); }
verify() { # STREAM: exactly once over it, manifest finished
    dur_check_json
    lz4 -tq "$out/completions.jsonl.lz4" || fail "lz4 -t"
    node "$src/tests/oracles/verify_outputs.cjs" "$out" "-=$1" >"$work/verify.log" ||
        { cat "$work/verify.log"; exit 1; }
    if [ -d "$src/third_party/npm/node_modules/ajv" ]; then
        node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/manifest.schema.json" \
            "$out/manifest.json" >/dev/null || fail "manifest schema"
    fi
    node -e 'const m = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
             if (!m.records.finished || !m.stdin || m.stdin.bytes !== +process.argv[2])
               { console.error("FAIL: manifest", JSON.stringify(m.stdin)); process.exit(1); }' \
        "$out/manifest.json" "$(stat -c %s "$1")"
}

# 1. kill -9 once something is committed, then another stream: refused, nothing written.
"$build/tokenmill" -q run "$work/job.json" <"$work/a.jsonl" >"$work/run.log" 2>&1 &
pid=$!
for _ in $(seq 400); do
    [ -f "$out/manifest.json" ] && break
    sleep 0.01
done
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
[ -f "$out/manifest.json" ] || fail "no commit before the kill"
dur_check_json
finished=$(node -p 'JSON.parse(require("fs").readFileSync(process.argv[1])).records.finished' \
    "$out/manifest.json")
# The first refused run may still cut torn tails of the kill (bytes no manifest names), so the
# outputs are compared from then on.
run_in "$work/other.jsonl"
[ "$rc" = 1 ] || fail "another stream after a kill: want exit 1, got $rc"
grep -q "standard input is not the stream this job's output folder was made from" "$work/run.log" ||
    fail "no clear message for another stream"
sums >"$work/sums0"
run_in "$work/other.jsonl"
[ "$rc" = 1 ] || fail "another stream (again): exit $rc"
sums | cmp -s - "$work/sums0" || fail "a refused stream changed the outputs"
run_in "$work/a.jsonl"
[ "$rc" = 0 ] || fail "resume with the same stream: exit $rc"
verify "$work/a.jsonl"
echo "e2e_stdin_resume: kill -9 (finished before the kill: $finished), other stream refused" \
    "with the outputs unchanged, same stream resumed: $(cat "$work/verify.log")"

# 2. finished: the same stream plus new lines answers the new lines only.
run_in "$work/ab.jsonl"
[ "$rc" = 0 ] || fail "same stream + new lines: exit $rc"
grep -q "already finished" "$work/run.log" && fail "a stdin job said already finished"
verify "$work/ab.jsonl"
echo "e2e_stdin_resume: new lines after the stream answered: $(cat "$work/verify.log")"

# 3. the same stream again: nothing new; a shorter or a different one: refused, unchanged.
(cd "$out" && sha256sum completions.jsonl.lz4 errors.jsonl) >"$work/data_sums"
run_in "$work/ab.jsonl"
[ "$rc" = 0 ] || fail "same stream again: exit $rc"
(cd "$out" && sha256sum completions.jsonl.lz4 errors.jsonl) | cmp -s - "$work/data_sums" ||
    fail "the same stream again changed the data files"
verify "$work/ab.jsonl"
sums >"$work/sums1"
run_in "$work/a.jsonl"
[ "$rc" = 1 ] || fail "a shorter stream: want exit 1, got $rc"
grep -q "standard input ended after" "$work/run.log" || fail "no clear message for a shorter stream"
cat "$work/other.jsonl" "$work/b.jsonl" >"$work/other_b.jsonl"
run_in "$work/other_b.jsonl"
[ "$rc" = 1 ] || fail "a different stream: want exit 1, got $rc"
sums | cmp -s - "$work/sums1" || fail "a refused stream changed the outputs"
echo "e2e_stdin_resume: same stream again adds nothing; shorter and different streams refused"
