# bench/device_env.sh - sourced by the device-run scripts (decode_round, ablate, host_gap,
# tp_device_run): the log folder $OUT, the prebuilt binaries in $B with the libraries the device
# image lacks in $B/lib, and NVLink multicast off (shared machines, the device library's KINDS.md).
set -u
OUT=${OUT:-out-device}
B=${B:-.devcarry}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
