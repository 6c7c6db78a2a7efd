#!/usr/bin/env bash
# bench/sample_job_device.sh - on a GPU machine (issue 22): real `tokenmill run` jobs, backend
# cuda, sampled against greedy on a random-weight checkpoint (llama3.1-8b widths by default,
# DeepSeek V3 tokenizer, 129,280 ids; written by tools/mkmodel, to RAM when W is under /dev/shm).
# 8 sequences x 256 tokens (ignore_eos), max_seqs 8: greedy; temperature 0.8 / top-p 0.95;
# + top-k 50; + repetition penalty 1.1; + logprobs top-5; n = 2 siblings (4 records) sampled.
# Prints each job's decode tok/s and the job log's count of steps greedy / sampled on the engine.
# Env: B (tokenmill, mkmodel), TOK (tokenizer folder), OUT (logs), W (work folder), SHAPE_ARGS.
set -u
B=$(cd "${B:?binaries folder}" && pwd); TOK=$(cd "${TOK:?tokenizer folder}" && pwd)
OUT=${OUT:-out-device}; W=${W:-/dev/shm/sjob}
SHAPE_ARGS=${SHAPE_ARGS:---layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ff 14336 --tied 0}
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t0=$(date +%s)
[ -f "$W/model/config.json" ] ||
  "$B/mkmodel" --out "$W/model" --arch llama --seed 3 $SHAPE_ARGS --vocab 129280 --ctx 8192 \
    --dtype bf16 --rope-theta 500000 --uniform 1 --tokenizer "$TOK" > "$OUT/mkmodel.log" 2>&1 ||
  { echo "mkmodel failed"; tail "$OUT/mkmodel.log"; exit 1; }
echo "checkpoint ready in $(( $(date +%s) - t0 )) s ($(du -sh "$W/model" | cut -f1))"
python3 - "$W" <<'PY'
import json, random, sys
w = sys.argv[1]
words = "time data model river stone light paper music green table window garden".split()
rng = random.Random(11)
prompts = [" ".join(rng.choice(words) for _ in range(500)) for _ in range(8)]
samp = {"temperature": 0.8, "top_p": 0.95}
modes = {"greedy": {"temperature": 0}, "topp": samp, "topk": dict(samp, top_k=50),
         "reppen": dict(samp, repetition_penalty=1.1), "logprobs": dict(samp, logprobs=True, top_logprobs=5),
         "n2": dict(samp, n=2)}
for kind, f in modes.items():
    with open(f"{w}/{kind}.jsonl", "w") as fo:
        for i, p in enumerate(prompts[:4] if kind == "n2" else prompts):
            fo.write(json.dumps(dict({"id": f"{kind}-{i}", "prompt": p, "max_tokens": 256,
                                      "ignore_eos": True, "seed": i}, **f)) + "\n")
    with open(f"{w}/{kind}.json", "w") as fo:
        json.dump({"model": "model", "input": {"files": [f"{kind}.jsonl"]},
                   "output": {"dir": f"out-{kind}"},
                   "engine": {"backend": "cuda", "max_seqs": 8, "max_batched_tokens": 8192,
                              "block_size": 16, "kv_blocks": 0, "prefix_cache": False}}, fo)
PY
for kind in greedy topp topk reppen logprobs n2; do
  rm -rf "$W/out-$kind"
  (cd "$W" && "$B/tokenmill" run "$kind.json") > "$OUT/job_$kind.log" 2>&1
  rc=$?
  python3 - "$W/out-$kind/metrics.json" "$kind" "$rc" "$(grep -o '[0-9]* of [0-9]* steps were greedy on the engine.*' "$OUT/job_$kind.log")" <<'PY'
import json, sys
try:
    m = json.load(open(sys.argv[1]))
except Exception as e:
    print("%s: rc=%s, no metrics (%s)" % (sys.argv[2], sys.argv[3], e)); sys.exit(0)
def find(o, k):
    if isinstance(o, dict):
        for kk, v in o.items():
            if kk == k: return v
            r = find(v, k)
            if r is not None: return r
    return None
e = find(m, "engine") or {}
print("%s: rc=%s decode %.1f tok/s (%s tokens in %.3f s); %s"
      % (sys.argv[2], sys.argv[3], find(m, "decode_tok_s") or 0, e.get("decode_tokens"),
         e.get("decode_s") or 0, sys.argv[4]))
PY
done
