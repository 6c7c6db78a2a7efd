#!/usr/bin/env bash
# bench/ablate.sh - what each kind of op costs inside the decode graph: bench_engine W8 decode
# with TM_CUDA_ABLATE naming ops that are planned but not launched (outputs meaningless; see
# src/runner/engine/cuda/engine_cuda_int.h, TM_CUDA_ABL_*). The difference to the full step is
# the op's marginal cost.
# Prebuilt binaries in $B (with lib/), logs in $OUT. Env: SHAPE (llama8b-half), ARGS (extra
# bench_engine arguments, e.g. "--tp 2"). Usage: OUT=... B=.devcarry bash bench/ablate.sh [sets...]
. "$(dirname "$0")/device_env.sh"
SHAPE=${SHAPE:-llama8b-half}
ARGS=${ARGS:-}
sets=${*:-none norm qkv rope attn o gu silu down lm norm,rope,attn,silu qkv,o,gu,down,lm}
for set in $sets; do
  abl=$set; [ "$set" = none ] && abl=
  printf '%-8s %-24s ' "$SHAPE" "$set"
  TM_CUDA_ABLATE=$abl $B/bench_engine --shape "$SHAPE" --batch 8 --no-ceiling $ARGS \
    2>> "$OUT/ablate_stderr.log" | tee -a "$OUT/ablate.log" | grep -o "decode [0-9.]* ms/step"
done
