#!/usr/bin/env bash
# bench/dsv4_job_vs_bench.sh - on a GPU machine: a real `tokenmill run` job with backend cuda on a
# random-weight DeepSeek-V4 checkpoint at Flash widths with few layers (tools/mkmodel --arch
# deepseek_v4, FP8 128x128 block dense + MXFP4 routed experts, the DeepSeek V3 tokenizer), 8 prompts
# of ~512 tokens, GEN greedy tokens each, max_seqs 8; then bench_engine --shape dsv4-flash
# --layers NL --batch 8 at the same prompt and generation lengths. Issue 21 asks the job's decode
# rate to be within 10% of the bench's. The layer schedule is the bench's (layers 0-1 sliding, then
# CSA / HCA alternating; layers 0-2 hash-routed), so both run the same shapes.
# Env: B (folder with tokenmill, mkmodel, bench_engine), TOK (tokenizer folder), OUT (logs),
# W (work folder, default /tmp/dsv4jvb; about 4 GB a layer), NL (layers, default 3), GEN (default
# 128).
set -u
B=$(cd "${B:?binaries folder}" && pwd); TOK=$(cd "${TOK:?tokenizer folder}" && pwd)
OUT=${OUT:-out-device}; W=${W:-/tmp/dsv4jvb}; NL=${NL:-3}; GEN=${GEN:-128}
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} # libraries the machine lacks
LT="" MT=""
for ((i = 0; i < NL; i++)); do
  if ((i < 2)); then LT+=s; elif ((i % 2)); then LT+=h; else LT+=c; fi
  if ((i < 3)); then MT+=h; else MT+=m; fi
done
t0=$(date +%s)
[ -f "$W/model/config.json" ] ||
  "$B/mkmodel" --out "$W/model" --arch deepseek_v4 --seed 3 --layers "$NL" --hidden 4096 \
    --heads 64 --head-dim 512 --ff 2048 --ctx 65536 --q-lora 1024 --o-groups 8 --o-lora 1024 \
    --vocab 129280 --experts 256 --experts-used 6 --window 128 --index-heads 64 --index-dim 128 \
    --index-topk 512 --hc 4 --rope-dim 64 --hca-ratio 128 --dsv4-layers "$LT" --dsv4-mlp "$MT" \
    --uniform 1 --quant fp8-block --expert-dtype fp4 --tokenizer "$TOK" \
    > "$OUT/mkmodel.log" 2>&1 ||
  { echo "mkmodel failed"; tail "$OUT/mkmodel.log"; exit 1; }
echo "checkpoint ($NL layers $LT / $MT) ready in $(( $(date +%s) - t0 )) s ($(du -sh "$W/model" | cut -f1))"
python3 - "$W/in.jsonl" <<'PY'
import json, random, sys
words = ("time data model river stone light paper music green table window garden number "
         "market system report letter winter summer engine signal planet forest bridge").split()
rng = random.Random(11)
with open(sys.argv[1], "w") as f:
    for i in range(8):
        text = " ".join(rng.choice(words) for _ in range(512))
        f.write(json.dumps({"id": "d8-%d" % i, "prompt": text}) + "\n")
PY
cat > "$W/job.json" <<JOB
{ "model": "model", "input": { "files": ["in.jsonl"] }, "output": { "dir": "out" },
  "engine": { "backend": "cuda", "max_seqs": 8, "max_batched_tokens": 8192, "block_size": 128,
              "kv_blocks": 0, "prefix_cache": false },
  "defaults": { "max_tokens": $GEN, "temperature": 0 } }
JOB
rm -rf "$W/out"
t1=$(date +%s)
(cd "$W" && "$B/tokenmill" run job.json) > "$OUT/job.log" 2>&1
echo "tokenmill run rc=$? in $(( $(date +%s) - t1 )) s"
grep -E "KV pool|greedy on the engine|records|error|E " "$OUT/job.log" | head -8
cp "$W/out/metrics.json" "$OUT/job_metrics.json" 2>/dev/null
python3 "$(dirname "$0")/job_metrics.py" "$W/out/metrics.json"
"$B/bench_engine" --shape dsv4-flash --layers "$NL" --batch 8 --prompt 512 --gen "$GEN" --reps 2 \
  2>/dev/null | grep -E "dsv4-flash"
