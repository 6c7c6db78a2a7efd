#!/usr/bin/env bash
# bench/sample_device.sh - issue 22 on one GPU, in one device call (STEPS picks the parts):
#   test  tests/gpu/test_sample_cuda (device vs CPU sampling, allowed-ids bitmasks, logprobs)
#   ncu   Nsight Compute durations of the sampler (sample_f32) and greedy (argmax_f32) kernels in
#         bench_engine's decode steps (8B shape, 8 sequences)
#   bench bench_engine --sample-device (greedy vs the device sampling modes, ms/step) on the
#         llama3.1-8b and qwen2.5-7b shapes at batch 8 and 1
#   job   a real `tokenmill run` job, greedy then sampled (temperature 0.8 / top-p 0.95), on a
#         random-weight llama3.2-1b-shape checkpoint (tools/mkmodel, DeepSeek V3 tokenizer:
#         vocabulary 129,280), 8 prompts of 512 words, 256 tokens each, max_seqs 8
# Env: STEPS (default "test ncu bench job"), SHAPES, BATCHES, GEN (decode tokens, default 128).
# Run from a folder holding stripped test_sample_cuda, bench_engine, tokenmill and mkmodel plus
# tok/ (tokenizer.json, tokenizer_config.json), with the shared libraries in ../new/lib (see
# COMMON.md device runs: .devcarry/NAME); logs go to /tmp/o and $OUT/o.tgz.
set -u
cd "$(dirname "$0")"
D=$PWD
export LD_LIBRARY_PATH=$D/../new/lib:${LD_LIBRARY_PATH:-}
export TM_BUILD=$D
O=/tmp/o
mkdir -p $O
STEPS=${STEPS:-test ncu bench job}
GEN=${GEN:-128}
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
{ nvidia-smi; date -u; } > $O/env.txt 2>&1

if has test; then
  timeout 150 ./test_sample_cuda > $O/test_sample_cuda.log 2>&1
  echo "rc $?" >> $O/test_sample_cuda.log
  grep -E "identical|allowed|^rc |FAIL" $O/test_sample_cuda.log | tail -14
  stamp test
fi

if has ncu; then
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout 150 "$NCU" --clock-control none -k 'regex:sample_f32|argmax_f32' -c 30 \
    --section SpeedOfLight --section LaunchStats --section Occupancy \
    ./bench_engine --shape llama8b --batch 8 --prompt 512 --gen 3 --reps 1 --sample-device \
    > $O/ncu.log 2>&1
  echo "ncu rc $?"
  # launch order: greedy (6 argmax), then per sampled mode 2 runs x (1 argmax + 2 samples)
  awk '/\(.*\)x\(/ {name=$1} /^ *Duration/ {print name, $(NF-1), $NF}' $O/ncu.log |
    awk '{k[NR]=$0} END {for (i = 1; i <= NR; i++) print i, k[i]}' | tr '\n' ';'
  echo
  stamp ncu
fi

if has bench; then
  for sh in ${SHAPES:-llama3.1-8b qwen2.5-7b}; do
    for b in ${BATCHES:-8 1}; do
      timeout 100 ./bench_engine --shape $sh --batch $b --prompt 512 --gen $GEN --reps 2 \
        --sample-device > $O/bench_${sh}_b$b.log 2> $O/bench_${sh}_b${b}_stderr.log
      echo "bench $sh B$b rc $?"
      grep -E "^sample" $O/bench_${sh}_b$b.log
    done
  done
  stamp bench
fi

if has job; then
  W=/tmp/jvb
  mkdir -p $W
  ./mkmodel --out $W/model --arch llama --seed 3 --layers 16 --hidden 2048 --heads 32 \
    --kv-heads 8 --ff 8192 --vocab 129280 --ctx 8192 --tied 1 --dtype bf16 \
    --rope-theta 500000 --rope-scaling llama3 --uniform 1 --tokenizer $D/tok \
    > $O/mkmodel.log 2>&1 || { echo "mkmodel failed"; tail $O/mkmodel.log; }
  stamp "checkpoint $(du -sh $W/model | cut -f1)"
  python3 - "$W/in.jsonl" << 'PY'
import json, random, sys
words = ("time data model river stone light paper music green table window garden number "
         "market system report letter winter summer engine signal planet forest bridge").split()
rng = random.Random(11)
with open(sys.argv[1], "w") as f:
    for i in range(8):
        text = " ".join(rng.choice(words) for _ in range(512))
        f.write(json.dumps({"id": "w8-%d" % i, "prompt": text}) + "\n")
PY
  for mode in greedy sampled; do
    dflt='"max_tokens": 256, "temperature": 0'
    [ $mode = sampled ] && dflt='"max_tokens": 256, "temperature": 0.8, "top_p": 0.95, "seed": 5'
    cat > $W/job.json << JOB
{ "model": "model", "input": { "files": ["in.jsonl"] }, "output": { "dir": "out-$mode" },
  "engine": { "backend": "cuda", "max_seqs": 8, "max_batched_tokens": 8192, "block_size": 16,
              "kv_blocks": 0, "prefix_cache": false },
  "defaults": { $dflt } }
JOB
    rm -rf $W/out-$mode
    (cd $W && timeout 120 $D/tokenmill run job.json) > $O/job_$mode.log 2>&1
    echo "job $mode rc $?"
    grep -E "greedy on the engine" $O/job_$mode.log | head -2
    cp $W/out-$mode/metrics.json $O/job_${mode}_metrics.json 2> /dev/null
    python3 - $W/out-$mode/metrics.json $mode << 'PY'
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
print("job %s: decode %.1f tok/s (%s tokens in %.3f s over %s steps), output %.1f tok/s"
      % (sys.argv[2], find(m, "decode_tok_s") or 0, e.get("decode_tokens"),
         e.get("decode_s") or 0, e.get("steps"), find(m, "output_tok_s") or 0))
PY
  done
  stamp job
fi
tar czf "$OUT/o.tgz" -C /tmp o
