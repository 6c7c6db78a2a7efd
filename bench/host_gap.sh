#!/usr/bin/env bash
# bench/host_gap.sh - how much of a W8 decode step (8B shape) is GPU time and how much the GPU
# waits between steps (host work, the TP plan broadcast), at TP1 and TP2. bench_engine's ms/step
# is wall time per step; with TM_CUDA_PROFILE=1 the engine also records an event at each step's
# start and end on its stream, whose interval ("sample/gather + copy out", graphs on) is the
# step's GPU time: metadata upload, decode graph, argmax (with TP: its candidate all-gather), ids
# copy. Prebuilt binaries in $B (with lib/), logs in $OUT.
# Usage: OUT=... B=.devcarry bash bench/host_gap.sh
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv
for tp in 1 2; do
  for prof in 0 1; do
    log="$OUT/tp${tp}_prof${prof}.log"
    TM_CUDA_PROFILE=$prof $B/bench_engine --batch 8 --no-ceiling --tp $tp > "$log" 2>&1
    echo "tp$tp profile=$prof rc=$? $(grep -o 'decode [0-9.]* ms/step' "$log" | head -1)"
    grep -E "TM_CUDA_PROFILE|sample/gather" "$log"
  done
done
