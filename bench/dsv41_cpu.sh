#!/usr/bin/env bash
# bench/dsv41_cpu.sh [BUILD] - the DeepSeek-V4.1 CPU engine through `tokenmill run` on a random
# mkmodel checkpoint (Engram on 2 layers, compress ratios 0/2/2/1/1/1 with candidate selection,
# dim 256, 8 heads x 64, 8 experts top-2, its built-in tokenizer): 16 prompts of about 330 tokens,
# 16 greedy tokens each, 2 threads; TP 1 and the in-process TP 2 (tensor parallel tests the split,
# it is not a CPU speed-up). Prints the job's prefill / decode tok/s and wall time per setting.
# What to compare with: nothing yet (the first V4.1 figures); the figures are for the record.
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/mkmodel" --arch deepseek_v41 --out "$work/model" --seed 1 --layers 6 --dim 256 \
    --heads 8 --head-dim 64 --q-lora 128 --o-groups 4 --o-lora 64 --ff 128 --experts 8 --topk 2 \
    --window 64 --compress-ratios 0,2,2,1,1,1 --kv-sources 1,3 --index-sources 1,3,5 \
    --candidate-source 3 --candidate-topk-blocks 8 --candidate-block-size 8 --index-topk 32 \
    >/dev/null
python3 - "$work/in.jsonl" <<'PY'
import json, sys
words = "the cafe naive hello world token mill abc uber fi ss".split()
rows = []
for i in range(16):
    text = " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(150))
    rows.append({"id": "r%d" % i, "prompt": text, "max_tokens": 16})
open(sys.argv[1], "w").write("\n".join(json.dumps(r) for r in rows) + "\n")
PY
for tp in 1 2; do
    cat >"$work/job_$tp.json" <<JOB
{
  "model": "$work/model",
  "input": { "files": ["$work/in.jsonl"] },
  "output": { "dir": "$work/out_$tp" },
  "engine": { "backend": "cpu", "max_seqs": 16, "max_batched_tokens": 512, "block_size": 64,
              "threads": 2, "tp": $tp },
  "defaults": { "temperature": 0 }
}
JOB
    "$build/tokenmill" run "$work/job_$tp.json" >"$work/run_$tp.log" 2>&1 || { cat "$work/run_$tp.log"; exit 1; }
    python3 - "$work/out_$tp/metrics.json" "$tp" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
t, th = m["tokens"], m["throughput"]
print("tp %s: %d prompt + %d completion tokens, prefill %.1f tok/s, decode %.1f tok/s, wall %.2f s"
      % (sys.argv[2], t["prompt"], t["completion"], th["prefill_tok_s"], th["decode_tok_s"],
         m["time"]["wall_s"]))
PY
done
