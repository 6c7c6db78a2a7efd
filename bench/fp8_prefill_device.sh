#!/usr/bin/env bash
# bench/fp8_prefill_device.sh - on a GPU machine, one call: the W8A8 FP8 prefill's checks and
# figures (issue 19). Stages (default all): test (test_lt_fp8; test_engine_cuda with the default
# path and with TM_CUDA_FP8_PREFILL=dequant), prefill (P: 8 x 2048 in one step, bf16 / FP8 block
# W8A8 / FP8 block dequantized / FP8 channel W8A8, and W8 decode of the same engines), shapes
# (bench/shapes.sh), job (bench/job_vs_bench.sh with QUANT=fp8-block).
# Env: B (binaries + lib/), OUT (logs), TOK (tokenizer folder for the job stage).
set -u
B=${B:?binaries folder}; OUT=${OUT:-out-device}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
stages=${*:-test prefill shapes job}
for st in $stages; do
  case $st in
  test)
    TM_BUILD=$B TM_SRC=. "$B/test_kernels" > "$OUT/test_kernels.log" 2>&1
    echo "test_kernels rc=$? $(grep checks "$OUT/test_kernels.log" | tail -1)"; grep FAIL "$OUT/test_kernels.log" | head -5
    "$B/test_lt_fp8" > "$OUT/test_lt_fp8.log" 2>&1; echo "test_lt_fp8 rc=$?"
    grep -E "lt |FAIL|checks" "$OUT/test_lt_fp8.log" | head -20
    for p in auto dequant; do
      TM_CUDA_FP8_PREFILL=$p TM_BUILD=$B TM_SRC=. "$B/test_engine_cuda" > "$OUT/eng_$p.log" 2>&1
      echo "test_engine_cuda ($p) rc=$? $(grep checks "$OUT/eng_$p.log" | tail -1)"
      grep -E "^fp8|FAIL" "$OUT/eng_$p.log" | head -8
    done ;;
  prefill)
    for c in "bf16 auto" "fp8-block auto" "fp8-block dequant" "fp8-channel w8a8" "fp8-channel auto"; do
      set -- $c
      TM_CUDA_FP8_PREFILL=$2 "$B/bench_engine" --quant "$1" --batch 8 --prompt 2048 --gen 64 \
        --reps 3 > "$OUT/p_$1_$2.log" 2> "$OUT/p_$1_$2.err"
      echo "P $1 ($2): $(grep -E '^prefill \(TTFT' "$OUT/p_$1_$2.log") | $(grep -E '^decode' "$OUT/p_$1_$2.log")"
    done ;;
  shapes)
    B=$B OUT=$OUT/shapes GEN=${GEN:-64} REPS=${REPS:-2} bash bench/shapes.sh ;;
  job)
    B=$B TOK=${TOK:?tokenizer} OUT=$OUT/job QUANT=fp8-block W=/tmp/jvb8 bash bench/job_vs_bench.sh ;;
  esac
done
