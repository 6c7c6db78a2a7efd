#!/usr/bin/env bash
# bench/sample_device.sh - issue 22 on one GPU: tests/gpu/test_sample_cuda (device vs CPU sampling),
# then bench_engine --sample-all (8B shape, W8: greedy vs device sampling modes, one process).
# Run from a folder holding stripped test_sample_cuda, bench_engine and mkmodel (see COMMON.md
# device runs: .devcarry/NAME); logs go to /tmp/o and $OUT/o.tgz.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/../new/lib:${LD_LIBRARY_PATH:-}
export TM_BUILD=$PWD
mkdir -p /tmp/o
{ nvidia-smi; date -u; } > /tmp/o/env.txt 2>&1
timeout 240 ./test_sample_cuda > /tmp/o/test_sample_cuda.log 2>&1; echo "rc $?" >> /tmp/o/test_sample_cuda.log
tail -5 /tmp/o/test_sample_cuda.log
timeout 280 ./bench_engine --shape llama8b --batch 8 --prompt 512 --gen 256 --reps 3 --sample-all \
    > /tmp/o/bench.log 2> /tmp/o/bench_stderr.log; echo "rc $?" >> /tmp/o/bench.log
cat /tmp/o/bench.log
tar czf "$OUT/o.tgz" -C /tmp o
