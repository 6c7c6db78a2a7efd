#!/usr/bin/env bash
# bench/kv_fp8_device.sh - the fp8 KV cache on one GPU, in one device call (run from the folder
# holding the stripped binaries: test_kernels, test_attn_prefill, test_engine_cuda, bench_engine,
# mkmodel, with lib/ or LD_LIBRARY_PATH for the shared libraries): the GPU tests (kernels with
# bf16 and fp8 KV, CUDA vs CPU engine with fp8 KV, the pool's 2x), then the 8B shape's W8 decode
# with bf16 KV and fp8 KV interleaved at 2048 and 4096 tokens of context, and the KV pool's token
# capacity from the same memory for both. Logs in $LOGS (default /tmp/o), tarred to $OUT.
set -u
LOGS=${LOGS:-/tmp/o}
mkdir -p "$LOGS"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$LOGS/gpu.txt" 2>&1
for t in test_kernels test_attn_prefill test_engine_cuda; do
    TM_BUILD=. TM_SRC=. timeout 240 ./$t > "$LOGS/$t.log" 2>&1
    echo "$t rc=$? $(grep -E 'checks' "$LOGS/$t.log" | tail -1)"
    grep -E "FAIL|check failed" "$LOGS/$t.log" | head -5
done
grep -E 'kv-fp8|kv_copy|KV pool|rope_kv fp8|greedy differs' "$LOGS/test_engine_cuda.log" "$LOGS/test_kernels.log" | head -40
for L in 2048 4096; do
    for kv in bf16 fp8; do
        pool=""
        [ "$L" = 2048 ] && pool="--kv-pool"
        timeout 120 ./bench_engine --shape llama8b --batch 8 --prompt $L --gen 128 --reps 3 \
            --kv-dtype $kv $pool > "$LOGS/bench_L${L}_$kv.log" 2>&1
        echo "bench L $L kv $kv rc=$?"
        grep -E '^\{|^decode|^ceiling|^kv pool|^prefill \(' "$LOGS/bench_L${L}_$kv.log"
    done
done
tar -C "$LOGS" -czf "${OUT:-.}/kv_fp8_logs.tgz" .
