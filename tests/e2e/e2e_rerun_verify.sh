#!/usr/bin/env bash
# tests/e2e/e2e_rerun_verify.sh BUILD SRC - a rerun never derives anything from damaged outputs,
# and never overwrites a results file that is not tokenmill's (issue 35), with real runs:
#   damaged   after a finished `-o res.jsonl` job, res.d/completions.jsonl.lz4 truncated, a byte
#             of it flipped, or errors.jsonl emptied: the rerun exits 1 naming the file and what is
#             wrong, and res.jsonl is left byte for byte as it was;
#   intact    the rerun of the intact job says "already finished" and leaves res.jsonl the same;
#   foreign   `-o notes.jsonl` over a file tokenmill did not write is refused (exit 1, the hint
#             names --restart) and the file is left; so is a res.jsonl edited after the job
#             finished; with --restart both are overwritten.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$src/tests/e2e/durable_lib.sh"
dur_setup 60
cd "$work"
fail() {
    echo "FAIL: $*"
    cat "$work/run.log" 2>/dev/null || true
    exit 1
}
opts=(--model model -i data/in.jsonl --backend cpu --max-seqs 4 --threads 1 --max-tokens 2
      --temperature 0)
run() { timeout 120 "$build/tokenmill" -q run "${opts[@]}" "$@" >run.log 2>&1; }
expect_fail() { # REGEX ARGS...
    local re=$1 rc=0
    shift
    run "$@" || rc=$?
    [ "$rc" = 1 ] || fail "want exit 1, got $rc (run $*)"
    grep -Eq -- "$re" run.log || fail "want a message matching /$re/"
}
run -o res.jsonl || fail "first run"
[ -s res.jsonl ] || fail "no res.jsonl"
cp -a res.d good.d
cp res.jsonl good.jsonl
run -o res.jsonl || fail "rerun of the intact job"
grep -q "already finished" run.log || fail "intact rerun: no 'already finished'"
cmp -s res.jsonl good.jsonl || fail "intact rerun changed res.jsonl"
echo "e2e_rerun_verify: intact ok"

# ---- damaged outputs: refused, res.jsonl untouched ----
damage() { # HOW
    rm -rf res.d
    cp -a good.d res.d
    case $1 in
    truncate) truncate -s -7 res.d/completions.jsonl.lz4 ;;
    flip) # a byte in the middle of the compressed data: the frame's checksum must catch it
        size=$(stat -c %s res.d/completions.jsonl.lz4)
        printf '\xff' | dd of=res.d/completions.jsonl.lz4 bs=1 seek=$((size / 2)) conv=notrunc status=none ;;
    empty_errors) : >res.d/errors.jsonl ;;
    grow) echo '{"extra": 1}' >>res.d/errors.jsonl ;;
    esac
}
for how in truncate flip empty_errors grow; do
    damage "$how"
    cp good.jsonl res.jsonl
    case $how in
    truncate) re="completions.jsonl.lz4 has [0-9]+ bytes, but the manifest commits" ;;
    flip) re="completions.jsonl.lz4: the LZ4 data is damaged|completions.jsonl.lz4: the committed" ;;
    empty_errors) re="errors.jsonl has 0 bytes, but the manifest commits" ;;
    grow) re="errors.jsonl has [0-9]+ bytes, but the manifest commits .*wrote to it" ;;
    esac
    expect_fail "finished job in .*res.d has damaged outputs.*($re)" -o res.jsonl
    grep -q -- "--restart" run.log || fail "$how: no --restart hint"
    cmp -s res.jsonl good.jsonl || fail "$how: res.jsonl was rewritten from damaged outputs"
done
rm -rf res.d
cp -a good.d res.d
echo "e2e_rerun_verify: damaged ok (truncated, flipped byte, emptied and grown errors.jsonl)"

# ---- foreign results files ----
echo "my notes, not tokenmill's" >notes.jsonl
cp notes.jsonl notes.orig
expect_fail "output.results_file notes.jsonl already exists, and it is not tokenmill's result" \
    -o notes.jsonl
grep -q -- "--restart" run.log || fail "foreign: no --restart hint"
cmp -s notes.jsonl notes.orig || fail "foreign notes.jsonl changed"
echo '{"edited": true}' >>res.jsonl
cp res.jsonl res.edited
expect_fail "output.results_file res.jsonl differs from the finished job's outputs" -o res.jsonl
cmp -s res.jsonl res.edited || fail "an edited res.jsonl was overwritten"
run -o notes.jsonl --restart || fail "--restart over notes.jsonl"
ids() { python3 -c 'import json,sys; print(sorted(json.loads(l).get("id") or json.loads(l).get("custom_id") or str(json.loads(l).get("line")) for l in open(sys.argv[1])))' "$1"; }
[ "$(ids notes.jsonl)" = "$(ids good.jsonl)" ] || fail "--restart did not write the results over notes.jsonl"
echo "e2e_rerun_verify: foreign ok (a file of the user's and an edited results file refused)"
