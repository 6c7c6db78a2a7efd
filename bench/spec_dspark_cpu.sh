#!/usr/bin/env bash
# bench/spec_dspark_cpu.sh - issue 37, DSpark drafts for DeepSeek-V4.1 on the CPU engine:
#  1. the cost of one DSpark draft pass (the drafter's rows for the newly kept position and its
#     block of dspark_block_size = 6 tokens through 2 stages, Markov head included) and of a
#     verification step of k = 5 drafts (6 tokens, 6 logits rows per sequence), against one plain
#     decode step, at batch 1 and 8, on a random mkmodel V4.1 checkpoint (dim 256, 6 layers with
#     compress ratios 0/2/2/1/1/1, 2 DSpark stages reading layers 1, 3, 5; 2 engine threads; 20
#     repetitions; 58-token context): test_dsv41_dspark's "cost" lines;
#  2. `tokenmill run` wall time with DSpark (k = 5) on and off on the two-token-by-construction
#     checkpoint of e2e_dspark (tests/oracles/v41_binary_head.py: drafts accepted about half the
#     time), 16 greedy records of 64 tokens, max_seqs 1 and 4; DSpark also with DeepSpec's
#     confidence_threshold 0.5 ("conf": drafts cut at the first unsure row).
# Usage: bench/spec_dspark_cpu.sh [BUILD_DIR]   (run from the repository root)
set -euo pipefail
build=${1:-build}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$build/mkmodel" --arch deepseek_v41 --out "$dir/m" --seed 9 --layers 6 --dim 256 --heads 8 \
    --head-dim 64 --q-lora 128 --o-groups 4 --o-lora 64 --ff 256 --experts 8 --topk 2 \
    --window 32 --compress-ratios 0,2,2,1,1,1,0,0 --kv-sources 1,3 --index-sources 1,3,5 \
    --engram-layers 0 --dspark 2 --dspark-block 6 --dspark-targets 1,3,5 --markov-rank 64 \
    >/dev/null
TM_SRC=$PWD TM_BUILD=$PWD/$build TM_DSPARK_BENCH="$dir/m" "$build/test_dsv41_dspark" |
    grep "cost batch"
"$build/mkmodel" --arch deepseek_v41 --out "$dir/b" --seed 37 --layers 3 \
    --compress-ratios 0,2,1,0,0 --kv-sources 1,2 --index-sources 1,2 --engram-layers 0 \
    --window 8 --dspark 2 --dspark-block 6 --dspark-targets 0,2 --markov-rank 32 >/dev/null
python3 tests/oracles/v41_binary_head.py "$dir/b" 100 101
python3 -c '
import json
for i in range(16):
    print(json.dumps({"id": "g%d" % i, "prompt": "hello world cafe %d " % i * 3, "max_tokens": 64}))
' >"$dir/in.jsonl"
for ms in 1 4; do
    for on in off on conf; do
        sp=""
        [ "$on" = on ] && sp=', "speculative": {"method": "dspark", "num_speculative_tokens": 5}'
        [ "$on" = conf ] && sp=', "speculative": {"method": "dspark", "num_speculative_tokens": 5, "confidence_threshold": 0.5}'
        cat >"$dir/job.json" <<JOB
{ "model": "$dir/b", "input": { "files": ["$dir/in.jsonl"] }, "output": { "dir": "$dir/out_$ms$on" },
  "engine": { "backend": "cpu", "max_seqs": $ms, "max_batched_tokens": 128, "block_size": 16,
              "threads": 2 $sp },
  "defaults": { "temperature": 0 } }
JOB
        t0=$(date +%s.%N)
        "$build/tokenmill" -q run "$dir/job.json" >/dev/null 2>&1
        t1=$(date +%s.%N)
        python3 - "$dir/out_$ms$on/metrics.json" "$ms" "$on" "$t0" "$t1" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
sp = m.get("speculative") or {}
print("  run max_seqs %s dspark %-4s: %.2f s wall, %s steps%s" % (sys.argv[2], sys.argv[3],
      float(sys.argv[5]) - float(sys.argv[4]), m["engine"].get("steps"),
      ", acceptance %.2f, mean acceptance length %.2f" % (sp["acceptance_rate"],
      sp["mean_acceptance_length"]) if sp else ""))
PY
    done
done
