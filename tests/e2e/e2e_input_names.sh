#!/usr/bin/env bash
# tests/e2e/e2e_input_names.sh BUILD SRC - input paths are byte strings end to end (issue 35): a
# file whose name is not valid UTF-8 (and one with a backslash) given with -i, found in a folder
# and matched by a glob is read, never dropped: every record is answered; in JSON outputs
# (errors.jsonl "file", manifest.json inputs, --print-job) its name is written losslessly with
# \xHH for each byte outside UTF-8 and \x5c for a backslash (base/utf8.h), and the printed job
# runs the same files; a rerun finds the manifest's names the same and says "already finished".
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$src/tests/e2e/durable_lib.sh"
dur_setup 10
cd "$work"
fail() {
    echo "FAIL: $*"
    cat run.log 2>/dev/null || true
    exit 1
}
bad=$(printf 'caf\xe9-\xff.jsonl') # Latin-1 é and a stray byte: not UTF-8
bs='back\slash.jsonl'
mkdir d
printf '{"id":"a1","prompt":"one","max_tokens":1}\n{"id":"a2","prompt":"two"\n' >"d/$bad"
printf '{"id":"b1","prompt":"three","max_tokens":1}\n' >"d/$bs"
printf '{"id":"c1","prompt":"four","max_tokens":1}\n' >d/plain.jsonl
opts=(--model model --backend cpu --threads 1 --max-tokens 1 --temperature 0)
tm() { timeout 120 "$build/tokenmill" -q run "$@" >run.log 2>&1; }
check_out() { # DIR PREFIX: 3 answers, 1 error naming the file losslessly
    local o=$1 p=$2 n
    n=$(lz4 -dc "$o/completions.jsonl.lz4" | wc -l)
    [ "$n" = 3 ] || fail "$o: $n answers (want 3: a1, b1, c1; a file was dropped?)"
    grep -qF "{\"file\":\"${p}caf\\\\xe9-\\\\xff.jsonl\",\"line\":2," "$o/errors.jsonl" ||
        fail "$o: errors.jsonl does not name the file losslessly: $(cat "$o/errors.jsonl")"
    python3 - "$o/manifest.json" "$p" <<'PY' || fail "$o: manifest inputs"
import json, sys
m = json.load(open(sys.argv[1]))
names = [f["path"] for f in m["inputs"]]
p = sys.argv[2]
want = {p + "caf\\xe9-\\xff.jsonl", p + "back\\x5cslash.jsonl"}
assert want <= set(names), names
PY
}
tm "${opts[@]}" -i "d/$bad" -i "d/$bs" -i d/plain.jsonl -o out-i || fail "-i run"
check_out out-i "d/"
tm "${opts[@]}" -i "d/$bad" -i "d/$bs" -i d/plain.jsonl -o out-i || fail "-i rerun"
grep -q "already finished" run.log || fail "-i rerun: not 'already finished'"
tm "${opts[@]}" -i d -o out-dir || fail "folder run"
check_out out-dir "d/"
tm "${opts[@]}" -i 'd/*.jsonl' -o out-glob || fail "glob run"
check_out out-glob "d/"
"$build/tokenmill" run "${opts[@]}" -i "d/$bad" -i "d/$bs" -i d/plain.jsonl -o out-job \
    --print-job >job2.json
grep -qF '"d/caf\\xe9-\\xff.jsonl"' job2.json || fail "--print-job: $(cat job2.json)"
tm job2.json || fail "the printed job"
check_out out-job "d/"
echo "e2e_input_names: ok (-i, folder, glob, printed job: non-UTF-8 and backslash names read, named losslessly)"
