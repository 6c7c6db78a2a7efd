#!/usr/bin/env bash
# bench/dsv41_emu/run.sh BUILD - the DeepSeek-V4.1 CUDA engine's host code against the CPU engine
# without a GPU (emu_main.c; both modes against the CPU engine, see run() below): built here with ASan against BUILD's (a -DTM_CUDA=OFF, preferably
# TM_SANITIZE=ON build folder with mkmodel) libraries, then run on the configs of
# tests/gpu/test_dsv41_cuda.c, each also with CUDA graphs (emulated: a second engine replays its
# pure decode steps from recorded segments and must equal the eager one bit for bit, on that
# schedule and on test_dsv41_cuda's graphs_case schedule). Needs the CUDA headers
# (/usr/local/cuda/include) only.
set -euo pipefail
b=$(cd "${1:?build folder}" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=address,undefined -fno-omit-frame-pointer \
    -Wall -Wextra -I"$src/src" -I"$src" -I"$src/tests" -I"$src/tests/gpu" \
    -I/usr/local/cuda/include \
    "$src"/bench/dsv41_emu/emu_main.c "$src"/bench/dsv41_emu/emu_kernels.c \
    "$src"/bench/dsv41_emu/emu_cuda.c "$src"/bench/dsv41_emu/emu_fast.c \
    "$src"/src/runner/engine/cuda/dsv41.c \
    "$src"/src/runner/engine/cuda/dsv41_engram.c "$src"/src/runner/engine/cuda/weights.c \
    "$b/libtm_runner.a" "$b/libtm_base.a" $(pkg-config --libs jansson libutf8proc liblz4 zlib libxxhash) \
    -lm -lpthread -o "$out/emu"
# each config twice: the exact mode and the fast mode (emu_fast.c's host kernels), both against
# the CPU engine (bounds in emu_main.c; with the GPU test's --fp8-block-spread 1: block scales
# that differ). EMU_CHAOTIC=1 before a config: the candidate-selection configs, where near-tie swaps
# seeded by rounding change later tokens (bench/RESULTS.md, "fourth GPU call"): the fast mode gets
# the loose bounds there.
run() {
    TM_BUILD="$b" TM_DSV41_CUDA_EXACT=1 "$out/emu" --fp8-block-spread 1 "$@" &&
        TM_BUILD="$b" TM_DSV41_CUDA_EXACT=0 "$out/emu" --fp8-block-spread 1 "$@"
}
fail=0
run --seed 40 --layers 2 --compress-ratios 0,0 --kv-sources none --index-sources none \
    --engram-layers none --window 8 || fail=1
run --seed 47 --layers 2 --compress-ratios 0,0 --kv-sources none --index-sources none \
    --engram-layers 0 --window 8 || fail=1
run --seed 44 --layers 2 --compress-ratios 0,1 --kv-sources 1 --index-sources 1 \
    --engram-layers none --index-heads 4 --index-topk 4 --window 8 || fail=1
run --seed 49 --layers 3 --compress-ratios 0,2,2 --kv-sources 1 --index-sources 1 \
    --engram-layers none --index-heads 4 --index-topk 4 --window 8 || fail=1
run --seed 41 --layers 3 --compress-ratios 0,2,1 --kv-sources 1,2 --index-sources 1,2 \
    --engram-layers 0 --index-heads 16 --index-topk 4 --window 8 || fail=1
run --seed 48 --layers 4 --compress-ratios 0,4,4,0 --kv-sources 1 --index-sources 1 \
    --engram-layers none --index-heads 16 --index-topk 6 --original-seq-len 0 --experts 6 \
    --topk 3 --window 8 || fail=1
run --seed 42 --layers 5 --compress-ratios 0,2,2,1,1 --kv-sources 1,3 --index-sources 1,3 \
    --engram-layers 0,2 --index-heads 16 --index-topk 8 --window 16 || fail=1
EMU_CHAOTIC=1 run --seed 43 --layers 6 --compress-ratios 0,2,1,1,1,0 --kv-sources 1,2 --index-sources 1,2,4 \
    --candidate-source 2 --candidate-topk-blocks 4 --candidate-block-size 8 --index-heads 16 \
    --index-topk 16 --engram-layers 3 --engram-ngram 4 --engram-heads 3 --hc 3 --window 32 || fail=1
EMU_CHAOTIC=1 run --seed 46 --layers 4 --compress-ratios 1,2,2,2 --kv-sources 0,1 --index-sources 0,1,3 \
    --candidate-source 1 --candidate-topk-blocks 3 --candidate-block-size 4 --index-heads 16 \
    --index-topk 8 --engram-layers 1,3 --hc 2 --swiglu-limit 0 --window 16 || fail=1
# the indexer over the step's tokens in chunks of 3 (TM_DSV41_INDEX_CHUNK; long contexts chunk
# by the score rows' size, dsv41.c init): the candidate config above again, each chunk's rows,
# lens, candidates and picks at their token offsets
TM_DSV41_INDEX_CHUNK=3 EMU_CHAOTIC=1 run --seed 43 --layers 6 --compress-ratios 0,2,1,1,1,0 \
    --kv-sources 1,2 --index-sources 1,2,4 --candidate-source 2 --candidate-topk-blocks 4 \
    --candidate-block-size 8 --index-heads 16 --index-topk 16 --engram-layers 3 --engram-ngram 4 \
    --engram-heads 3 --hc 3 --window 32 || fail=1
# every step's MoE pairs in expert order (TM_DSV41_MOE_SORT_MIN=1; by default only steps of more
# pairs than one MoE launch takes, prefill): the packed experts' rows, weights and the combine
# through the sorted pairs (the fast mode; the exact one runs as always)
TM_DSV41_MOE_SORT_MIN=1 run --seed 42 --layers 5 --compress-ratios 0,2,2,1,1 --kv-sources 1,3 \
    --index-sources 1,3 --engram-layers 0,2 --index-heads 16 --index-topk 8 --window 16 || fail=1
exit $fail
