#!/bin/bash
# bench/dsv4_cuda_run.sh - the device run of issue 21's DeepSeek-V4 CUDA work (bench/RESULTS.md,
# 2026-12-01 "DeepSeek-V4 on the CUDA engine"): test_dsv4_cuda (CUDA vs CPU engine), one case with
# the FP8 decode GEMMs off, two cases under compute-sanitizer memcheck, bench_engine --shape
# dsv4-flash (8 layers fp8-block + MXFP4, 4 layers bf16) and a TM_CUDA_PROFILE run of eager steps.
# Build here (cmake -DTM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90), strip test_dsv4_cuda,
# bench_engine and mkmodel into a folder with this script, carry it with the shared libraries
# (../new/lib beside it) and run it there; logs go to /tmp/o and, as a tarball, to $OUT.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/../new/lib:$LD_LIBRARY_PATH TM_BUILD=$PWD
mkdir -p /tmp/o
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > /tmp/o/gpu.txt 2>&1
( time timeout 100 ./test_dsv4_cuda ) > /tmp/o/test.log 2>&1; echo "rc=$?" >> /tmp/o/test.log
grep -E "^(ok|FAIL)|checks|baseline|tie-free\)|choices\)|kv_copy" /tmp/o/test.log
( TM_CUDA_DSV4_FP8=0 TM_DSV4_ONLY=fp8-mxfp4-tie-free timeout 30 ./test_dsv4_cuda ) > /tmp/o/test_nofp8.log 2>&1; echo "rc=$?" >> /tmp/o/test_nofp8.log
grep -E "tie-free\)|checks" /tmp/o/test_nofp8.log
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for c in fp8-mxfp4-tie-free mix-hc4-bf16; do
( TM_DSV4_ONLY=$c timeout 60 $SAN --tool memcheck --error-exitcode 9 ./test_dsv4_cuda ) > /tmp/o/san_$c.log 2>&1; echo "rc=$?" >> /tmp/o/san_$c.log
tail -3 /tmp/o/san_$c.log
done
( time timeout 90 ./bench_engine --shape dsv4-flash --layers 8 --batch 1,8 --prompt 512 --gen 64 --reps 2 ) > /tmp/o/bench.log 2>&1; echo "rc=$?" >> /tmp/o/bench.log
grep -v "I cuda" /tmp/o/bench.log
( timeout 60 ./bench_engine --shape dsv4-flash --quant bf16 --layers 4 --batch 1,8 --prompt 256 --gen 32 --reps 1 ) > /tmp/o/bench_bf16.log 2>&1; echo "rc=$?" >> /tmp/o/bench_bf16.log
grep -v "I cuda" /tmp/o/bench_bf16.log
( TM_CUDA_PROFILE=1 TM_DSV4_NO_GRAPHS=1 timeout 60 ./bench_engine --shape dsv4-flash --layers 4 --batch 1 --prompt 256 --gen 16 --reps 1 ) > /tmp/o/prof.log 2>&1; echo "rc=$?" >> /tmp/o/prof.log
tar czf $OUT/o.tgz -C /tmp o
