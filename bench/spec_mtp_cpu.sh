#!/usr/bin/env bash
# bench/spec_mtp_cpu.sh - issue 25, MTP drafts on the CPU engine: the cost of one MTP draft step
# (tm_dsv4_mtp_forward, one row per sequence: a chained draft) and of a verification step with
# k = 3 drafts, against one decode step, at batch 1 and 8, on a small random DeepSeek-V4 checkpoint
# made by mkmodel (2 engine threads; 20 repetitions; 63-token context). Prints test_spec_mtp's
# "cost" lines. Usage: bench/spec_mtp_cpu.sh [BUILD_DIR]   (run from the repository root)
set -euo pipefail
build=${1:-build}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$build/mkmodel" --out "$dir/m" --arch deepseek_v4 --tokenizer models/demo-pystdlib \
    --hidden 256 --heads 8 --head-dim 64 --o-groups 4 --o-lora 64 --q-lora 128 --ff 256 \
    --ctx 1024 --window 32 --index-heads 4 --index-dim 32 --index-topk 8 --rope-dim 16 \
    --experts 8 --experts-used 2 --hca-ratio 16 --hc 4 --dtype bf16 --seed 9 --layers 4 \
    --dsv4-layers schs --dsv4-mlp hmmm --dsv4-mtp sm --dsv4-mtp-copy 3 >/dev/null
TM_SRC=$PWD TM_BUILD=$PWD/$build TM_SPEC_MTP_BENCH="$dir/m" "$build/test_spec_mtp" | grep "cost batch"
