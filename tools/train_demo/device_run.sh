#!/usr/bin/env bash
# tools/train_demo/device_run.sh - the one GPU-machine call that made models/demo-pystdlib: a smoke
# run first (tiny model, 30 steps, the tokenizer check against tokenmill, the fixture script and a
# tokenmill CPU run of the result; any failure ends the call there), then the real training, then
# the transformers fixtures; everything under /tmp/o is tarred into $OUT/h23model.tgz.
# Run from a folder holding train_demo.py, make_demo_fixture.py, a CPU tokenmill binary (tokenmill.bin,
# with the wrapper ./tokenmill that points LD_LIBRARY_PATH at lib/) and lib/
# (its shared libraries):  TRAIN_MINUTES=4.25 bash device_run.sh
set -u
here=$PWD
O=/tmp/o
rm -rf "$O"
mkdir -p "$O/smoke" "$O/run"
# ./tokenmill is a wrapper that sets LD_LIBRARY_PATH=lib for tokenmill.bin alone (not for python)
finish() { tar -C "$O" -czf "${OUT:-/tmp}/h23model.tgz" . ; ls -la "${OUT:-/tmp}"; }
trap finish EXIT
t0=$(date +%s)
[ -n "${SKIP_ENV:-}" ] || {
    nvidia-smi -L
    python3 -c 'import sys, sysconfig, torch, transformers, tokenizers; print(sys.executable, sys.version); print("stdlib", sysconfig.get_paths()["stdlib"]); print(torch.__version__, transformers.__version__, tokenizers.__version__, torch.cuda.is_available())'
    ./tokenmill --version
} >"$O/env.txt" 2>&1

stdlib=()
if [ -f stdlib311.tgz ]; then # the corpus carried over: CPython 3.11.7's Lib/ with Lib/test
    mkdir -p /tmp/stdlib && tar -C /tmp/stdlib -xzf stdlib311.tgz && stdlib=(--stdlib /tmp/stdlib/python3.11)
fi
# 1. smoke (SKIP_SMOKE=1 leaves it out)
smoke() {
    timeout 150 python3 train_demo.py --smoke --out "$O/smoke/model" --aux "$O/smoke" \
        --tokenmill ./tokenmill >"$O/smoke/log.txt" 2>&1 || { echo "SMOKE: train_demo failed"; return 1; }
    python3 - "$O/smoke/training.json" <<'EOF2' || { echo "SMOKE: tokenizer disagreement"; return 1; }
import json, sys
r = json.load(open(sys.argv[1]))["tokenmill_tokenizer_agreement"]
print("smoke agreement", r)
sys.exit(0 if r and r["equal"] == r["texts"] else 1)
EOF2
    timeout 90 python3 make_demo_fixture.py --model "$O/smoke/model" --snippet "$O/smoke/test_snippet.txt" \
        --fixtures "$O/smoke/fx" >"$O/smoke/fixture_log.txt" 2>&1 || { echo "SMOKE: fixture script failed"; return 1; }
    printf '{"id":"a","prompt":"def f(x):","max_tokens":8,"temperature":0,"prompt_logprobs":true}\n' \
        >"$O/smoke/in.jsonl"
    cat >"$O/smoke/job.json" <<JOB
{ "model": "$O/smoke/model", "input": { "files": ["$O/smoke/in.jsonl"] },
  "output": { "dir": "$O/smoke/tm-out" }, "engine": { "backend": "cpu", "threads": 4 } }
JOB
    timeout 60 ./tokenmill -q run "$O/smoke/job.json" >"$O/smoke/tm_log.txt" 2>&1 ||
        { echo "SMOKE: tokenmill run failed"; return 1; }
    echo "smoke ok after $(($(date +%s) - t0)) s"
}
if [ -z "${SKIP_SMOKE:-}" ]; then
    smoke || exit 1
fi

# 2. training
timeout "${TRAIN_TIMEOUT:-420}" python3 train_demo.py --minutes "${TRAIN_MINUTES:-4.25}" \
    --out "$O/run/demo-pystdlib" --aux "$O/run" --tokenmill ./tokenmill "${stdlib[@]}" >"$O/run/log.txt" 2>&1
echo "train rc $? after $(($(date +%s) - t0)) s"
# 3. fixtures
timeout "${FIXTURE_TIMEOUT:-120}" python3 make_demo_fixture.py --model "$O/run/demo-pystdlib" --snippet "$O/run/test_snippet.txt" \
    --tok-agree "$O/run/tok_agree.jsonl" --fixtures "$O/run/fixtures" >"$O/run/fixture_log.txt" 2>&1
echo "fixture rc $? after $(($(date +%s) - t0)) s"
tail -5 "$O/run/log.txt"
