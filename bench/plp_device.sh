#!/usr/bin/env bash
# bench/plp_device.sh - on a GPU machine (issue 22): prompt logprobs and scoring records with the
# device path (forward_sample's scoring rows: k + 1 entries per position come back) against the
# host path (TM_CUDA_HOST_SAMPLE=1: every wanted position's fp32 logits row comes back and
# tm_sample_logprobs runs on the host), backend cuda, on a random-weight checkpoint written by
# tools/mkmodel (llama3.2-1b widths by default) with the DeepSeek V3 tokenizer (129,280 ids):
#   plp    8 records of ~512-token prompts, prompt_logprobs 5, max_tokens 1
#   score  8 records of ~256-token prompts, 2 continuations of ~64 tokens each, logprobs
# Prints each job's wall time, engine steps and step time, and compares the two paths' output
# lines: max |device - host| over every logprob, and the count of differing non-float fields.
# Env: B (folder with tokenmill, mkmodel), TOK (tokenizer folder), OUT (logs), W (work folder),
# SHAPE_ARGS (mkmodel width options; default the 1B shape), BACKEND (default cuda; cpu checks the
# script itself).
set -u
B=$(cd "${B:?binaries folder}" && pwd); TOK=$(cd "${TOK:?tokenizer folder}" && pwd)
OUT=${OUT:-out-device}; W=${W:-/tmp/plpdev}
SHAPE_ARGS=${SHAPE_ARGS:---layers 16 --hidden 2048 --heads 32 --kv-heads 8 --head-dim 64 --ff 8192 --tied 1}
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t0=$(date +%s)
[ -f "$W/model/config.json" ] ||
  "$B/mkmodel" --out "$W/model" --arch llama --seed 3 $SHAPE_ARGS --vocab 129280 --ctx 8192 \
    --dtype bf16 --rope-theta 500000 --tokenizer "$TOK" > "$OUT/mkmodel.log" 2>&1 ||
  { echo "mkmodel failed"; tail "$OUT/mkmodel.log"; exit 1; }
echo "checkpoint ready in $(( $(date +%s) - t0 )) s ($(du -sh "$W/model" | cut -f1))"
python3 - "$W" "${BACKEND:-cuda}" <<'PY'
import json, random, sys
w = sys.argv[1]
words = "time data model river stone light paper music green table window garden".split()
rng = random.Random(22)
def text(n): return " ".join(rng.choice(words) for _ in range(n))
with open(f"{w}/plp.jsonl", "w") as f:
    for i in range(8):
        f.write(json.dumps({"id": f"plp-{i}", "prompt": text(512), "max_tokens": 1,
                            "prompt_logprobs": 5}) + "\n")
with open(f"{w}/score.jsonl", "w") as f:
    for i in range(8):
        f.write(json.dumps({"id": f"score-{i}", "prompt": text(256), "logprobs": True,
                            "continuations": [" " + text(64), " " + text(64)]}) + "\n")
for kind in ("plp", "score"):
    with open(f"{w}/{kind}.json", "w") as f:
        json.dump({"model": "model", "input": {"files": [f"{kind}.jsonl"]},
                   "output": {"dir": f"out-{kind}"},
                   "engine": {"backend": sys.argv[2], "max_seqs": 8, "max_batched_tokens": 8192,
                              "block_size": 16, "kv_blocks": 0, "prefix_cache": False},
                   "defaults": {"temperature": 0}}, f)
PY
for kind in plp score; do
  for path in device host; do
    rm -rf "$W/out-$kind"
    if [ $path = host ]; then
      (cd "$W" && TM_CUDA_HOST_SAMPLE=1 "$B/tokenmill" run "$kind.json") > "$OUT/job_${kind}_$path.log" 2>&1
    else
      (cd "$W" && "$B/tokenmill" run "$kind.json") > "$OUT/job_${kind}_$path.log" 2>&1
    fi
    echo "$kind $path: tokenmill run rc=$?"
    cp "$W/out-$kind/metrics.json" "$OUT/metrics_${kind}_$path.json" 2>/dev/null
    lz4 -dc "$W/out-$kind/completions.jsonl.lz4" > "$W/res_${kind}_$path.jsonl" 2>/dev/null ||
      cat "$W"/out-$kind/completions.jsonl > "$W/res_${kind}_$path.jsonl" 2>/dev/null
    python3 - "$W/out-$kind/metrics.json" "$kind $path" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
e = m.get("engine", {})
st = e.get("steps") or 1
busy = (e.get("prefill_s") or 0) + (e.get("decode_s") or 0)
print("%s: wall %.2f s, %s steps, engine %.3f s (%.3f ms/step), records ok %s"
      % (sys.argv[2], m["time"]["wall_s"], st, busy, 1e3 * busy / st, m["records"]["ok"]))
PY
  done
  python3 - "$W/res_${kind}_device.jsonl" "$W/res_${kind}_host.jsonl" "$kind" <<'PY'
import json, sys
def load(p):
    out = {}
    for line in open(p):
        if line.strip():
            r = json.loads(line); out[r.get("id")] = r
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
skip = {"ttft_ms", "total_ms", "latency", "timing", "itl_ms", "tpot_ms", "e2e_ms"}
st = {"max": 0.0, "n": 0, "diff": 0}
def walk(x, y, k=""):
    if k in skip: return
    if isinstance(x, dict) and isinstance(y, dict):
        for kk in set(x) | set(y):
            if kk not in x or kk not in y:
                if kk not in skip: st["diff"] += 1
            else: walk(x[kk], y[kk], kk)
    elif isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y): st["diff"] += 1; return
        for u, v in zip(x, y): walk(u, v, k)
    elif isinstance(x, float) or isinstance(y, float):
        if isinstance(x, (int, float)) and isinstance(y, (int, float)):
            st["max"] = max(st["max"], abs(x - y)); st["n"] += 1
        else: st["diff"] += 1
    elif x != y: st["diff"] += 1
for i in set(a) | set(b):
    if i not in a or i not in b: st["diff"] += 1
    else: walk(a[i], b[i])
print("%s: device vs host: %d records, %d floats, max |diff| %.3g, %d other fields differ"
      % (sys.argv[3], len(a), st["n"], st["max"], st["diff"]))
PY
done
