#!/usr/bin/env bash
# bench/gemm_quant_ptxas.sh [FILE.cu] - ptxas resource use of every kernel instantiation of
# kernels/gemm_quant.cu (or FILE.cu, e.g. an older copy) for sm_90 and sm_121, as the project's
# flags build it: one line per kernel with its registers, stack frame and spills. No GPU needed;
# compare two versions with diff (kernel order is the compiler's, names demangled away).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
cu=${1:-$src/kernels/gemm_quant.cu}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$cu" "$src/kernels/.gemm_quant_ptxas_tmp.cu" # includes resolve as in the tree
trap 'rm -rf "$tmp" "$src/kernels/.gemm_quant_ptxas_tmp.cu"' EXIT
"$nvcc" -I"$src" -I"$src/src" -O2 -DNDEBUG -std=c++17 \
    --generate-code=arch=compute_90,code=sm_90 --generate-code=arch=compute_121,code=sm_121 \
    -Xptxas -v -c "$src/kernels/.gemm_quant_ptxas_tmp.cu" -o "$tmp/x.o" 2>&1 |
    awk '/Compiling entry/ {arch=$NF} /stack frame/ {sf=$1; ss=$5; sl=$9}
         /Used [0-9]+ registers/ {n++; printf "%s kernel%02d regs %s stack %s spill_st %s spill_ld %s\n", arch, n, $5, sf, ss, sl}'
