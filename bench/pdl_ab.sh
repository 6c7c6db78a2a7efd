#!/usr/bin/env bash
# bench/pdl_ab.sh - programmatic dependent launch of the decode kernels on and off
# (TM_CUDA_PDL), W8 decode on the 8B shape at TP1 and TP2 and on the 1B shape, after the GPU
# correctness tests (with it on, the default). Prebuilt binaries in $B (with lib/), logs in
# $OUT. Usage: OUT=... B=.devcarry bash bench/pdl_ab.sh
set -u
OUT=${OUT:-out-device}
B=${B:-.devcarry}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
OUT=$OUT B=$B bash bench/decode_round.sh test
for pdl in 1 0 1 0; do
  for args in "--batch 8" "--batch 8 --tp 2" "--shape llama1b --batch 8" "--batch 1"; do
    printf 'TM_CUDA_PDL=%s %-26s ' "$pdl" "$args"
    TM_CUDA_PDL=$pdl $B/bench_engine $args --no-ceiling 2>> "$OUT/bench_stderr.log" |
      tee -a "$OUT/bench.log" | grep -o "decode [0-9.]* ms/step.*aggregate"
  done
done
