#!/usr/bin/env bash
# bench/decode_round.sh - one device call for a decode-path change on a 2-GPU machine: the GPU
# correctness tests (kernels, CUDA vs CPU engine, TP2 vs TP1), then W8 decode on the 8B shape at
# TP1 and TP2, then what attention and the all-reduce cost inside the TP2 decode graph
# (bench/ablate.sh). Prebuilt binaries in $B (with lib/), logs in $OUT.
# Usage: OUT=... B=.devcarry bash bench/decode_round.sh [test] [bench]
. "$(dirname "$0")/device_env.sh"
stages=${*:-test bench}
has() { [[ " $stages " == *" $1 "* ]]; }
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv
if has test; then
  gpu_tests
  TM_BUILD=$B timeout -k 5 240 $B/test_tp_cuda > "$OUT/test_tp_cuda.log" 2>&1
  echo "test_tp_cuda rc=$? $(tail -1 "$OUT/test_tp_cuda.log")"
  grep -E "FAIL|greedy" "$OUT/test_tp_cuda.log" | grep -v "^ok" | head -8
fi
if has bench; then
  w8() { # label env... (then bench_engine W8 8B args)
    local label=$1; shift
    printf '%-34s ' "$label"
    env "$@" 2>> "$OUT/bench_stderr.log" | tee -a "$OUT/bench.log" | grep -o "decode [0-9.]* ms/step.*aggregate"
  }
  w8 "tp1" $B/bench_engine --batch 8 --no-ceiling
  w8 "tp2" $B/bench_engine --batch 8 --no-ceiling --tp 2
  w8 "tp1 ablate attn" TM_CUDA_ABLATE=attn $B/bench_engine --batch 8 --no-ceiling
  w8 "tp2 ablate attn" TM_CUDA_ABLATE=attn $B/bench_engine --batch 8 --no-ceiling --tp 2
  w8 "tp2 ablate ar" TM_CUDA_ABLATE=ar $B/bench_engine --batch 8 --no-ceiling --tp 2
  w8 "tp2 ablate norm,rope,attn,silu,ar" TM_CUDA_ABLATE=norm,rope,attn,silu,ar \
    $B/bench_engine --batch 8 --no-ceiling --tp 2
fi
