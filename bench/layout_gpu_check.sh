#!/usr/bin/env bash
# bench/layout_gpu_check.sh - one device call for a refactor of the CUDA engine (issue 18): the
# GPU correctness tests of the new tree, then W8 decode on the 8B shape with the old and the new
# bench_engine alternated in the same call (old, new, old, new), so the two figures share the
# machine's state. Optional extra stages run when their binaries are present (the quantized
# GEMM test and benchmark). Prebuilt binaries: new tree in $B, old tree's bench_engine in $BASE.
# Usage: OUT=... B=.devcarry/new BASE=.devcarry/base bash bench/layout_gpu_check.sh [stages]
# stages: test bench quant fp8 (default: all). fp8: bench_engine on the 8B shape with bf16, FP8
# block-scaled and FP8 per-channel random weights, W8 and W1 decode and P prefill, in that order.
. "$(dirname "$0")/device_env.sh"
BASE=${BASE:-.devcarry/base}
stages=${*:-test bench quant fp8}
has() { [[ " $stages " == *" $1 "* ]]; }
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if has test; then
  gpu_tests
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    TM_BUILD=$B timeout -k 5 240 $B/test_tp_cuda > "$OUT/test_tp_cuda.log" 2>&1
    echo "test_tp_cuda rc=$? $(tail -1 "$OUT/test_tp_cuda.log")"
  else
    echo "test_tp_cuda: not run (one GPU)"
  fi
fi
if has bench; then
  for round in 1 2; do
    for which in base new; do
      bin=$B/bench_engine; [ $which = base ] && bin=$BASE/bench_engine
      printf 'W8 8B %-4s round %d: ' $which $round
      $bin --batch 8 2>> "$OUT/bench_stderr.log" | tee -a "$OUT/bench_$which.log" |
        grep -o "decode [0-9.]* ms/step.*" | head -1
    done
  done
  printf 'W1 8B new: '; $B/bench_engine --batch 1 --no-ceiling 2>> "$OUT/bench_stderr.log" |
    tee -a "$OUT/bench_new.log" | grep -o "decode [0-9.]* ms/step.*" | head -1
fi
if has quant && [ -x $B/test_gemm_quant ]; then
  $B/test_gemm_quant > "$OUT/test_gemm_quant.log" 2>&1
  echo "test_gemm_quant rc=$? $(tail -1 "$OUT/test_gemm_quant.log")"
  grep -E "FAIL" "$OUT/test_gemm_quant.log" | head -10
  [ -x $B/bench_gemm_quant ] && $B/bench_gemm_quant > "$OUT/bench_gemm_quant.log" 2>&1
  tail -40 "$OUT/bench_gemm_quant.log" 2>/dev/null
fi
if has fp8; then
  for q in bf16 fp8-block fp8-channel; do
    for b in 8 1; do
      printf 'W%s 8B %-11s: ' $b $q
      $B/bench_engine --batch $b --quant $q 2>> "$OUT/bench_stderr.log" | tee -a "$OUT/bench_fp8.log" |
        grep -E "^weights|^decode|^ceiling" | tr '\n' ' '; echo
    done
  done
  for q in bf16 fp8-block; do
    printf 'P 8x2048 %-11s: ' $q
    $B/bench_engine --batch 8 --prompt 2048 --gen 1 --no-ceiling --quant $q \
      2>> "$OUT/bench_stderr.log" | tee -a "$OUT/bench_fp8.log" | grep -E "^prefill" | head -1
  done
fi
