#!/usr/bin/env bash
# bench/cuda_w_all.sh - on one GPU, in one call: the kernel tests, the HF transformers baseline
# (the anchors' hf_bench.py, llama8b, dynamic cache, W1 W8 P) and bench_engine's W8, W1, P on the
# llama8b shape and W8, W1 on llama1b, so that every tokenmill figure has its ceiling (measured
# by bench_engine in the same process) and its HF baseline from the same call. Env: B (binaries +
# lib/), A (folder with the anchors' scripts), OUT. Prints the tables; logs under $OUT.
set -u
B=${B:-.devcarry}; A=${A:-$B/anchors}; OUT=${OUT:-out-device}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv,noheader
for t in test_kernels test_attn_prefill; do
  "$B/$t" > "$OUT/$t.log" 2>&1; echo "$t rc=$?"; grep -E "FAIL|checks" "$OUT/$t.log" | tail -3
done
OUT=$OUT/hf BUDGET=${HF_BUDGET:-200} bash "$A/run_device.sh" hf:llama8b:dynamic:190 > "$OUT/hf.log" 2>&1
grep -E "llama8b" "$OUT/hf/tables.md" | head -8
for args in "--batch 8" "--batch 1" "--batch 8 --prompt 2048 --gen 1" "--shape llama1b --batch 8" \
            "--shape llama1b --batch 1"; do
  echo "== bench_engine $args"
  "$B/bench_engine" $args 2> "$OUT/bench_stderr.log" | tee -a "$OUT/bench.log" |
    grep -E "prefill|decode|ceiling"
done
