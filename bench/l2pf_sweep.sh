#!/usr/bin/env bash
# bench/l2pf_sweep.sh - on one GPU: the decode L2 warming (TM_CUDA_L2PF_MB) at a few budgets, on
# the llama8b shape and on one TP2 rank's shard of it (llama8b-half, no communication), after
# the kernel and engine correctness tests. Prebuilt binaries in $B (with lib/), logs in $OUT.
# Usage: OUT=... B=.devcarry bash bench/l2pf_sweep.sh [budgets in MB...]
set -u
OUT=${OUT:-out-device}
B=${B:-.devcarry}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
budgets=${*:-0 12 25 37}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if [ -z "${NO_TEST:-}" ]; then
  $B/test_kernels > "$OUT/test_kernels.log" 2>&1; echo "test_kernels rc=$?"
  grep -E "skinny rate|checks|FAIL" "$OUT/test_kernels.log" | tail -14
  TM_BUILD=$B TM_SRC=. $B/test_engine_cuda > "$OUT/test_engine_cuda.log" 2>&1
  echo "test_engine_cuda rc=$?"; grep -v '^greedy differs\|^ok ' "$OUT/test_engine_cuda.log" | tail -6
fi
for shape in llama8b-half llama8b; do
  for mb in $budgets; do
    printf '%-14s L2PF_MB=%-3s ' "$shape" "$mb"
    TM_CUDA_L2PF_MB=$mb $B/bench_engine --shape $shape --batch 8 --no-ceiling \
      2>> "$OUT/bench_stderr.log" | tee -a "$OUT/bench.log" | grep -i "decode" | head -2 | tr '\n' ' '
    echo
  done
done
