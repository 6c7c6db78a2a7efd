#!/usr/bin/env bash
# tests/e2e/e2e_input_grow.sh BUILD SRC - an input that grows while the job runs (issue 24 #5, a
# real process): lines appended during the run are not read (each file is read up to the size it
# had when the job started, the size the manifest records); the job finishes exactly once over the
# original bytes; a rerun says the input grew instead of calling it "another job".
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$src/tests/e2e/durable_lib.sh"
dur_setup 500
out="$work/out"
# Records carry a 1 KB field the model never sees, so the file is much longer than what the source
# has read ahead (records, not bytes) when the lines are appended.
pad=$(printf 'p%.0s' $(seq 1000))
sed -i "s/^{\"id\":\"r\([0-9]*\)\",/{\"id\":\"r\1\",\"pad\":\"$pad\",/" "$work/data/in.jsonl"
fail() { echo "FAIL: $*"; cat "$work/run.log"; exit 1; }
start() { # tokenmill in the background; pid in $pid; waits for the first commit
    "$build/tokenmill" -q run "$work/job.json" >"$work/run.log" 2>&1 &
    pid=$!
    for _ in $(seq 500); do
        [ -f "$out/manifest.json" ] && return 0
        sleep 0.01
    done
    fail "no commit within 5 s"
}
cp "$work/data/in.jsonl" "$work/orig.jsonl"
size0=$(stat -c %s "$work/data/in.jsonl")
start
for i in $(seq 50); do echo "{\"id\": \"late$i\", \"prompt\": \"appended during the run\"}"; done \
    >>"$work/data/in.jsonl"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 0 ] || fail "growing input: exit $rc"
node "$src/tests/oracles/verify_outputs.cjs" "$out" "$work/data/in.jsonl=$work/orig.jsonl" \
    >"$work/verify.log" || { cat "$work/verify.log"; exit 1; }
node -e 'const m = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
         if (!m.records.finished || m.inputs[0].size !== +process.argv[2]) process.exit(1)' \
    "$out/manifest.json" "$size0" || fail "manifest: not finished or not the size at start"
rc=0
dur_run || rc=$?
[ "$rc" = 1 ] || fail "rerun over the grown input: want exit 1, got $rc"
grep -q "in.jsonl grew from $size0 to" "$work/run.log" || fail "rerun does not say the input grew"
grep -q "another job" "$work/run.log" && fail "rerun calls a grown input another job"
echo "e2e_input_grow: input grown during the run: $(cat "$work/verify.log"); rerun says it grew"
