#!/usr/bin/env bash
# bench/job_vs_bench.sh - on a GPU machine: a real `tokenmill run` job with backend cuda on a
# random-weight llama8b-shape checkpoint (written by tools/mkmodel, DeepSeek V3 tokenizer, so
# the vocabulary is 129,280 instead of 128,256), W8-like: 8 prompts of ~512 tokens, 256 greedy
# tokens each, max_seqs 8, KV pool sized from free memory; then bench_engine --batch 8 on the
# same shape. Issue 7 asks the job's decode rate to be within 10% of the bench's.
# Env: B (folder with tokenmill, mkmodel, bench_engine), TOK (tokenizer folder), OUT (logs),
# W (work folder, default /tmp/jvb; the checkpoint is 16 GB), QUANT (bf16 default, or an mkmodel
# --quant format such as fp8-block: the checkpoint is then written quantized and the bench runs
# with the same --quant; issue 19 asks the FP8 job within 10% of the bench too).
set -u
B=$(cd "${B:?binaries folder}" && pwd); TOK=$(cd "${TOK:?tokenizer folder}" && pwd)
OUT=${OUT:-out-device}; W=${W:-/tmp/jvb}; QUANT=${QUANT:-bf16}
QARGS=(); [ "$QUANT" = bf16 ] || QARGS=(--quant "$QUANT")
mkdir -p "$OUT" "$W"
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} # libraries the machine lacks
t0=$(date +%s)
[ -f "$W/model/config.json" ] ||
  "$B/mkmodel" --out "$W/model" --arch llama --seed 3 --layers 32 --hidden 4096 --heads 32 \
    --kv-heads 8 --ff 14336 --vocab 129280 --ctx 8192 --tied 0 --dtype bf16 \
    --rope-theta 500000 --rope-scaling llama3 --uniform 1 --tokenizer "$TOK" "${QARGS[@]}" \
    > "$OUT/mkmodel.log" 2>&1 ||
  { echo "mkmodel failed"; tail "$OUT/mkmodel.log"; exit 1; }
echo "checkpoint ready in $(( $(date +%s) - t0 )) s ($(du -sh "$W/model" | cut -f1))"
# 8 prompts of 512 words drawn from a fixed list (seeded), raw text (no chat template)
python3 - "$W/in.jsonl" <<'PY'
import json, random, sys
words = ("time data model river stone light paper music green table window garden number "
         "market system report letter winter summer engine signal planet forest bridge").split()
rng = random.Random(11)
with open(sys.argv[1], "w") as f:
    for i in range(8):
        text = " ".join(rng.choice(words) for _ in range(512))
        f.write(json.dumps({"id": "w8-%d" % i, "prompt": text}) + "\n")
PY
cat > "$W/job.json" <<JOB
{ "model": "model", "input": { "files": ["in.jsonl"] }, "output": { "dir": "out" },
  "engine": { "backend": "cuda", "max_seqs": 8, "max_batched_tokens": 8192, "block_size": 16,
              "kv_blocks": 0, "prefix_cache": false },
  "defaults": { "max_tokens": 256, "temperature": 0 } }
JOB
rm -rf "$W/out"
t1=$(date +%s)
(cd "$W" && "$B/tokenmill" run job.json) > "$OUT/job.log" 2>&1
echo "tokenmill run rc=$? in $(( $(date +%s) - t1 )) s"
grep -E "KV pool|greedy on the engine|records|tp:" "$OUT/job.log" | head -8
cp "$W/out/metrics.json" "$OUT/job_metrics.json" 2>/dev/null
python3 "$(dirname "$0")/job_metrics.py" "$W/out/metrics.json"
"$B/bench_engine" --batch 8 --reps 2 "${QARGS[@]}" 2>/dev/null | grep -E "prefill|decode|ceiling"
