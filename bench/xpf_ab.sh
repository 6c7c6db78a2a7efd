#!/usr/bin/env bash
# bench/xpf_ab.sh - experiment: the skinny GEMM loading the tokens' x one chunk ahead
# (TM_SKINNY_XPF=1) against the plain loads, on a 2-GPU machine: the GPU tests with it on, the
# kernel's weight-stream rates on the 8B and TP2-shard decode shapes, and W8 decode at TP1 and TP2,
# alternating the two settings twice. Prebuilt binaries in $B, logs in $OUT.
# Usage: OUT=... B=.devcarry bash bench/xpf_ab.sh
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv
export TM_SKINNY_XPF=1
$B/test_kernels > "$OUT/test_kernels.log" 2>&1; echo "test_kernels rc=$? $(grep checks "$OUT/test_kernels.log" | tail -1)"
TM_BUILD=$B TM_SRC=. $B/test_engine_cuda > "$OUT/test_engine_cuda.log" 2>&1
echo "test_engine_cuda rc=$? $(tail -1 "$OUT/test_engine_cuda.log")"
TM_BUILD=$B timeout -k 5 240 $B/test_tp_cuda > "$OUT/test_tp_cuda.log" 2>&1
echo "test_tp_cuda rc=$? $(tail -1 "$OUT/test_tp_cuda.log")"
for x in 0 1; do
  TM_SKINNY_XPF=$x TM_SKINNY_SWEEP=1 $B/test_kernels > "$OUT/rates_xpf$x.log" 2>&1
  echo "rates xpf=$x:"; grep "skinny rate:  8 tok" "$OUT/rates_xpf$x.log" | grep "unroll  4, *132 SMs"
done
for round in 1 2; do
  for x in 0 1; do
    for tp in 1 2; do
      printf 'round %s xpf=%s tp%s: ' $round $x $tp
      TM_SKINNY_XPF=$x $B/bench_engine --batch 8 --no-ceiling --tp $tp 2>> "$OUT/bench_stderr.log" \
        | tee -a "$OUT/bench.log" | grep -o "decode [0-9.]* ms/step" | head -1
    done
  done
done
