#!/usr/bin/env bash
# bench/dsv4_tp_bisect.sh - on the GPU machine: test_dsv4_tp_cuda (TM_TP_COMM=host, ranks sharing
# GPU 0) on variants of the config that failed there on 2026-12-05 (hc2-f32-tied-vocab509: TP2/TP4
# logits far from TP1), each changing one factor, to tell which one breaks the CUDA TP path.
# Usage (sourced env from bench/device_env.sh): B=<binaries> OUT=<logs> bash bench/dsv4_tp_bisect.sh
set -u
. "$(dirname "$0")/device_env.sh"
C="--arch deepseek_v4 --hidden 128 --heads 4 --head-dim 64 --rope-dim 16 --q-lora 64 --o-groups 4 --o-lora 32 --ff 64 --ctx 1024 --window 32 --index-heads 16 --index-dim 32 --index-topk 512 --seed 37"
base() { # base with one substitution: base KEY VALUE ...
  local -A o=([layers]=3 [dsv4-layers]=hcs [hc]=2 [experts]=6 [experts-used]=3 [hca-ratio]=8 [tied]=1
    [yarn]=0 [vocab]=509 [dsv4-mlp]=hhh [dtype]=f32)
  while [ $# -gt 1 ]; do o[$1]=$2; shift 2; done
  local s="$C" k
  for k in "${!o[@]}"; do s="$s --$k ${o[$k]}"; done
  echo "$s"
}
cases="base=$(base)"
cases="$cases;vocab512=$(base vocab 512)"
cases="$cases;untied=$(base tied 0)"
cases="$cases;bf16=$(base dtype bf16)"
cases="$cases;hc4=$(base hc 4)"
cases="$cases;mlp_mmm=$(base dsv4-mlp mmm)"
cases="$cases;layers_sss=$(base dsv4-layers sss)"
cases="$cases;layers_hhh=$(base dsv4-layers hhh)"
cases="$cases;yarn1=$(base yarn 1)"
cases="$cases;experts8k2=$(base experts 8 experts-used 2)"
cases="$cases;v512_untied=$(base vocab 512 tied 0)"
TM_BUILD=$B TM_SRC=$PWD TM_TP_COMM=host TM_DSV4_TP_ONLY=none TM_DSV4_TP_CASES="$cases" \
  timeout -k 5 240 "$B/test_dsv4_tp_cuda" > "$OUT/dsv4_tp_bisect.log" 2>&1
echo "test_dsv4_tp_cuda (bisect) rc=$?"
grep -E "TP[24] \(|check failed|checks" "$OUT/dsv4_tp_bisect.log"
