#!/bin/bash
# bench/dsv4_perf_run.sh - the device runs of issue 21's DeepSeek-V4 decode work (bench/RESULTS.md,
# 2026-12-01 "DeepSeek-V4 CUDA: the real job, where a decode step's time goes"): test_dsv4_cuda
# (CUDA vs CPU engine), bench_engine --shape dsv4-flash (8 layers, batch 1 and 8), with PROF=1 an
# Nsight Compute run of one eager decode step at batch 1 and 8 (4 layers: sliding, sliding, CSA,
# HCA; bench/dsv4_ncu_summary.py reads it), with VAR=1 the expert split-K forced to 1 and 4
# (batch 1) and the job's shape (3 layers, batch 8, 128 tokens), with JOB=1 bench/dsv4_job_vs_bench.sh (NL layers).
# Build here (cmake -DTM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90), strip test_dsv4_cuda,
# bench_engine, tokenmill and mkmodel into a folder with the bench/dsv4_*.{sh,py} scripts and the
# DeepSeek V3 tokenizer (tok/), carry it with the shared libraries (../new/lib beside it) and run
# it there; logs go to /tmp/o and, as a tarball, to $OUT.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/../new/lib:$LD_LIBRARY_PATH TM_BUILD=$PWD
mkdir -p /tmp/o
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv > /tmp/o/gpu.txt 2>&1
( time timeout 100 ./test_dsv4_cuda ) > /tmp/o/test.log 2>&1; echo "rc=$?" >> /tmp/o/test.log
grep -E "^(ok|FAIL)|checks|tie-free\)|rc=" /tmp/o/test.log | tail -8
( timeout 90 ./bench_engine --shape dsv4-flash --layers 8 --batch 1,8 --prompt 512 --gen 64 --reps 2 ) > /tmp/o/bench.log 2>&1; echo "rc=$?" >> /tmp/o/bench.log
grep -v "I cuda" /tmp/o/bench.log
if [ "${VAR:-0}" = 1 ]; then # MXFP4 expert split-K forced (1: unsplit), and the job's shape
  for ms in 1 4; do
    TM_DSV4_MOE_SPLIT=$ms timeout 60 ./bench_engine --shape dsv4-flash --layers 8 --batch 1 --prompt 512 --gen 64 --reps 2 2>&1 | grep -v "I cuda" | sed "s/^/moe_split=$ms: /" | tee -a /tmp/o/bench_var.log
  done
  timeout 60 ./bench_engine --shape dsv4-flash --layers 3 --batch 8 --prompt 512 --gen 128 --reps 2 2>&1 | grep -v "I cuda" | tee -a /tmp/o/bench_var.log
fi
if [ "${PROF:-0}" = 1 ]; then
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for b in 1 8; do
    ( TM_DSV4_NO_GRAPHS=1 timeout 100 $NCU --clock-control none --metrics gpu__time_duration.sum --csv ./bench_engine --shape dsv4-flash --layers 4 --batch $b --prompt 512 --gen 2 --reps 1 ) > /tmp/o/ncu_b$b.csv 2> /tmp/o/ncu_b$b.err; echo "ncu b$b rc=$?"
    python3 dsv4_ncu_summary.py /tmp/o/ncu_b$b.csv 4 > /tmp/o/ncu_b$b.txt 2>&1; head -20 /tmp/o/ncu_b$b.txt
  done
fi
tar czf $OUT/o.tgz -C /tmp o
if [ "${JOB:-0}" = 1 ]; then
  B=$PWD TOK=$PWD/tok OUT=/tmp/o/job NL=${NL:-3} GEN=${GEN:-128} ./dsv4_job_vs_bench.sh 2>&1 | tee /tmp/o/job.txt
  tar czf $OUT/o.tgz -C /tmp o
fi
