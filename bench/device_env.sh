# bench/device_env.sh - sourced by the device-run scripts (decode_round, ablate, host_gap,
# tp_device_run, layout_gpu_check): the log folder $OUT, the prebuilt binaries in $B with the libraries the device
# image lacks in $B/lib, and NVLink multicast off (shared machines, the device library's KINDS.md).
set -u
OUT=${OUT:-out-device}
B=${B:-.devcarry}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0

# gpu_tests [TESTS...]: run the single-GPU test binaries of $B (default: the kernel, prefill
# attention and CUDA-vs-CPU engine tests), one summary line each plus their first failures; logs
# in $OUT/<test>.log. test_engine_cuda rebuilds its models with $B/mkmodel.
gpu_tests() {
  local t
  for t in ${*:-test_kernels test_attn_prefill test_engine_cuda}; do
    TM_BUILD=$B TM_SRC=. $B/$t > "$OUT/$t.log" 2>&1
    echo "$t rc=$? $(grep -E 'checks' "$OUT/$t.log" | tail -1)"
    grep -E "FAIL" "$OUT/$t.log" | head -5
  done
}
