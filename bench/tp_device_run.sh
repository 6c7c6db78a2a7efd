#!/usr/bin/env bash
# bench/tp_device_run.sh - tensor parallel on a machine with 2 GPUs, from prebuilt binaries (the
# GPU machine has no jansson, so nothing is built there): $B holds tokenmill, mkmodel,
# test_tp_cuda, bench_engine and lib/ (shared libraries the machine lacks); $TOK a tokenizer
# folder (tokenizer.json). Logs go to $OUT. Stages (default all):
#   test   tests/test_tp_cuda (TP2 vs TP1 on mkmodel models, graphs, kv_copy, a killed rank)
#   job    the same greedy job with tp 1, tp 2 (run starts rank 1 itself) and tp 2 as two
#          "nodes" (--nnodes 2, one process per GPU via CUDA_VISIBLE_DEVICES, TCP rendezvous);
#          outputs copied to $OUT/job_*/ for comparison
#   bench  bench_engine: 8B W8 and W1 decode, TP1 vs TP2 (+ TP2 with NCCL all-reduces only,
#          a profile of eager TP2 steps), P prefill
# Usage: OUT=... B=.devcarry TOK=.devcarry/tok bash bench/tp_device_run.sh [stages...]
. "$(dirname "$0")/device_env.sh"
TOK=${TOK:-$B/tok}
stages=${*:-test job bench}
has() { [[ " $stages " == *" $1 "* ]]; }
{
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv
  nvidia-smi topo -m
  echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
  ldd $B/tokenmill | grep -E "not found|nccl|jansson|rdkafka" || true
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

if has test; then
  t0=$(date +%s)
  TM_BUILD=$B timeout -k 5 240 $B/test_tp_cuda > "$OUT/test_tp_cuda.log" 2>&1
  echo "test_tp_cuda rc=$? in $(( $(date +%s) - t0 )) s"
  grep -v "^ok \|I cuda: tp rank" "$OUT/test_tp_cuda.log" | tail -30
fi

if has job; then
  W=$(mktemp -d)
  $B/mkmodel --out "$W/model" --arch llama --seed 7 --layers 4 --hidden 512 --heads 8 \
    --kv-heads 2 --ff 1024 --vocab 129280 --ctx 4096 --tied 0 --dtype bf16 --tokenizer "$TOK" \
    > /dev/null || echo "mkmodel failed"
  cp jobs/data/quickstart.jsonl "$W/in.jsonl"
  mkjob() { # name tp
    cat > "$W/$1.json" <<JOB
{ "model": "model", "input": { "files": ["in.jsonl"] }, "output": { "dir": "out_$1" },
  "engine": { "backend": "cuda", "tp": $2, "max_seqs": 8, "max_batched_tokens": 512,
              "block_size": 16 },
  "defaults": { "max_tokens": 64, "temperature": 0 } }
JOB
  }
  mkjob tp1 1; mkjob tp2 2; mkjob tp2nodes 2; mkjob missing 2
  for j in tp1 tp2; do
    t0=$(date +%s%N)
    timeout -k 5 120 $B/tokenmill run "$W/$j.json" > "$OUT/job_$j.log" 2>&1
    echo "job $j rc=$? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; tail -6 "$OUT/job_$j.log"
  done
  # two "nodes" on one host: node 0 runs the job on GPU 0, node 1 serves on GPU 1
  t0=$(date +%s%N)
  CUDA_VISIBLE_DEVICES=1 timeout -k 5 120 $B/tokenmill run "$W/tp2nodes.json" --nnodes 2 \
    --node-rank 1 --master-addr 127.0.0.1 --master-port 29533 > "$OUT/job_tp2nodes_n1.log" 2>&1 &
  n1=$!
  CUDA_VISIBLE_DEVICES=0 timeout -k 5 120 $B/tokenmill run "$W/tp2nodes.json" --nnodes 2 \
    --node-rank 0 --master-addr 127.0.0.1 --master-port 29533 > "$OUT/job_tp2nodes.log" 2>&1
  rc0=$?; wait $n1; rc1=$?
  echo "job tp2nodes rc=$rc0 (node 1 rc=$rc1) in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  tail -6 "$OUT/job_tp2nodes.log"; tail -3 "$OUT/job_tp2nodes_n1.log"
  # a missing node: node 0 alone must fail after the timeout, naming rank 1
  CUDA_VISIBLE_DEVICES=0 timeout -k 5 60 $B/tokenmill run "$W/missing.json" --nnodes 2 \
    --node-rank 0 --master-addr 127.0.0.1 --master-port 29534 --tp-timeout 5 \
    > "$OUT/job_missing.log" 2>&1
  echo "job with a missing node rc=$? (want 1)"; tail -2 "$OUT/job_missing.log"
  (cd "$W" && tar czf "$OUT/job_outputs.tgz" out_tp1 out_tp2 out_tp2nodes) # one file
  if command -v lz4 > /dev/null; then
    for j in tp2 tp2nodes; do
      if cmp -s <(lz4 -dc "$W/out_tp1/completions.jsonl.lz4" | sort) \
                <(lz4 -dc "$W/out_$j/completions.jsonl.lz4" | sort); then
        echo "completions $j == tp1"
      else
        echo "completions $j differ from tp1"
      fi
    done
  fi
  rm -rf "$W"
fi

if has bench; then
  run() { # label env... -- args
    local label=$1; shift
    echo "== $label"
    env "$@" 2> "$OUT/bench_stderr.log" | tee -a "$OUT/bench.log" | grep -v '^{'
    grep -E "rank|NCCL|error|create" "$OUT/bench_stderr.log" | head -3
  }
  run "tp1 8B W8" $B/bench_engine --batch 8
  run "tp2 8B W8" $B/bench_engine --batch 8 --tp 2
  run "tp1 8B W1" $B/bench_engine --batch 1 --no-ceiling
  run "tp2 8B W1" $B/bench_engine --batch 1 --tp 2 --no-ceiling
  run "tp2 8B W8, all-reduces on NCCL only" TM_TP_CUSTOM_AR=0 $B/bench_engine --batch 8 --tp 2 \
    --no-ceiling
  echo "== tp2 8B W8 eager, profiled (rank 0)"
  TM_CUDA_PROFILE=1 $B/bench_engine --batch 8 --tp 2 --no-graphs --no-ceiling --reps 1 --gen 64 \
    2>&1 | grep -E "us/call|decode|PROFILE" | head -24
  run "tp2 8B P prefill" $B/bench_engine --batch 8 --prompt 2048 --gen 1 --tp 2 --no-ceiling
fi
