#!/usr/bin/env bash
# bench/chain_round.sh - one device call for the decode chain (kernels/chain.h): the GPU
# correctness tests (kernels incl. the chain against the separate kernels, CUDA vs CPU engine,
# TP2 vs TP1 when there are two GPUs), then W8 decode on the 8B shape with the chain off and on
# at each ring depth, at TP1 and (two GPUs) TP2. Prebuilt binaries in $B (with lib/), logs in
# $OUT.
# Usage: OUT=... B=.devcarry bash bench/chain_round.sh [test] [bench] [depths="4 8 12"]
set -u
OUT=${OUT:-out-device}
B=${B:-.devcarry}
DEPTHS=${DEPTHS:-4 8 12}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on shared machines (KINDS.md)
stages=${*:-test bench}
has() { [[ " $stages " == *" $1 "* ]]; }
n_gpu=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv
if has test; then
  timeout -k 5 300 $B/test_kernels > "$OUT/test_kernels.log" 2>&1
  echo "test_kernels rc=$? $(grep -E 'checks' "$OUT/test_kernels.log" | tail -1)"
  grep -E "FAIL|chain" "$OUT/test_kernels.log" | head -8
  TM_BUILD=$B TM_SRC=. timeout -k 5 300 $B/test_engine_cuda > "$OUT/test_engine_cuda.log" 2>&1
  echo "test_engine_cuda rc=$? $(tail -1 "$OUT/test_engine_cuda.log")"
  grep -E "FAIL|max err" "$OUT/test_engine_cuda.log" | head -6
  if [ "$n_gpu" -ge 2 ]; then
    TM_BUILD=$B timeout -k 5 240 $B/test_tp_cuda > "$OUT/test_tp_cuda.log" 2>&1
    echo "test_tp_cuda rc=$? $(tail -1 "$OUT/test_tp_cuda.log")"
    grep -E "FAIL|greedy" "$OUT/test_tp_cuda.log" | grep -v "^ok" | head -8
  fi
fi
if has bench; then
  w8() { # label env... (then bench_engine W8 8B args)
    local label=$1; shift
    printf '%-28s ' "$label"
    timeout -k 5 120 env "$@" 2>> "$OUT/bench_stderr.log" | tee -a "$OUT/bench.log" |
      grep -o "decode [0-9.]* ms/step.*aggregate" || echo "(failed: see bench_stderr.log)"
  }
  tps="1"
  [ "$n_gpu" -ge 2 ] && tps="1 2"
  for tp in $tps; do
    w8 "tp$tp chain off" TM_CUDA_CHAIN=0 $B/bench_engine --batch 8 --no-ceiling --tp $tp
    for dp in $DEPTHS; do
      w8 "tp$tp chain depth $dp" TM_CUDA_CHAIN_DEPTH=$dp $B/bench_engine --batch 8 --no-ceiling \
        --tp $tp
    done
  done
fi
