#!/usr/bin/env bash
# bench/guided_device.sh - on a GPU machine (issue 26): a constrained W8 `tokenmill run` job
# against the same job unconstrained, backend cuda, on a random-weight checkpoint written by
# tools/mkmodel (llama3.2-1b widths by default: a 2.5 GB write; the issue names the 8B shape,
# whose 1.5-3x longer step hides a fixed mask cost better, so this is the harsher case) with the
# DeepSeek V3 tokenizer (129,280 ids). 8 prompts, 256 tokens each, greedy, max_seqs 8:
#   plain   no constraint (ignore_eos, so every record runs 256 tokens)
#   regex   guided_regex "[a-z ,.]+" (one looping DFA state: the cached-mask case)
#   schema  guided_json: an object with a required array of strings (a few looping states)
# and prints each job's decode tok/s and its guided metrics (masks, cold masks, mask time).
# Env: B (folder with tokenmill, mkmodel), TOK (tokenizer folder), OUT (logs), W (work folder;
# /dev/shm/... writes the checkpoint to RAM: 8B in 14 s), SHAPE_ARGS (mkmodel width options;
# default the 1B shape; the 8B: "--layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ff 14336
# --tied 0").
set -u
B=$(cd "${B:?binaries folder}" && pwd); TOK=$(cd "${TOK:?tokenizer folder}" && pwd)
OUT=${OUT:-out-device}; W=${W:-/tmp/gdev}
SHAPE_ARGS=${SHAPE_ARGS:---layers 16 --hidden 2048 --heads 32 --kv-heads 8 --head-dim 64 --ff 8192 --tied 1}
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
prompts = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(8)]
schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}},
          "required": ["items"], "additionalProperties": False}
for kind in ("plain", "regex", "schema"):
    with open(f"{w}/{kind}.jsonl", "w") as f:
        for i, p in enumerate(prompts):
            r = {"id": f"{kind}-{i}", "prompt": p, "max_tokens": 256}
            if kind == "plain": r["ignore_eos"] = True
            if kind == "regex": r["guided_regex"] = "[a-z ,.]+"
            if kind == "schema": r["guided_json"] = schema
            f.write(json.dumps(r) + "\n")
    with open(f"{w}/{kind}.json", "w") as f:
        json.dump({"model": "model", "input": {"files": [f"{kind}.jsonl"]},
                   "output": {"dir": f"out-{kind}"},
                   "engine": {"backend": "cuda", "max_seqs": 8, "max_batched_tokens": 8192,
                              "block_size": 16, "kv_blocks": 0, "prefix_cache": False},
                   "defaults": {"temperature": 0}}, f)
PY
for kind in plain regex schema; do
  rm -rf "$W/out-$kind"
  (cd "$W" && "$B/tokenmill" run "$kind.json") > "$OUT/job_$kind.log" 2>&1
  echo "$kind: tokenmill run rc=$?"
  cp "$W/out-$kind/metrics.json" "$OUT/metrics_$kind.json" 2>/dev/null
  python3 - "$W/out-$kind/metrics.json" "$kind" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
def find(o, k):
    if isinstance(o, dict):
        for kk, v in o.items():
            if kk == k: return v
            r = find(v, k)
            if r is not None: return r
    return None
e = find(m, "engine") or {}
g = find(m, "guided") or {}
print("%s: decode %.1f tok/s (%s tokens in %.3f s, %s steps); guided %s"
      % (sys.argv[2], find(m, "decode_tok_s") or 0, e.get("decode_tokens"), e.get("decode_s") or 0,
         e.get("steps"), json.dumps(g)))
PY
done
