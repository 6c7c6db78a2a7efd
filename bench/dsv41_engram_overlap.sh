#!/usr/bin/env bash
# bench/dsv41_engram_overlap.sh - issue 40: what the Engram row reads still cost a DeepSeek-V4.1
# decode step on the GPU once the overlap has hidden what it can (docs/deepseek_v41.md "CUDA").
# The CUDA engine reads each Engram layer's rows on the host (hashing, the row cache, pread,
# dequant into pinned memory, a copy on a stream of its own) while the layers before it run; a
# decode step replays one CUDA graph per stretch between Engram layers with those reads in
# between. This times decode steps of bench_engine --shape dsv41-flash (random weights, Engram
# tables written to a temporary folder; the released V4.1-Flash layers, by default one of each
# kind with Engram on layer 1 as in the released model) at batch 1 and 8, graphs on:
#   skip   TM_DSV41_ENGRAM_SKIP=1: no rows read (zeros), the Engram kernels still run
#   warm   the same prompts every rep: every row in the engine's row cache (dequant + copy only)
#   cold   new prompts every rep and the table file dropped from the page cache: rows from disk
#   eager  warm, every step launched eagerly (--graphs 0): what the graphs save
# warm - skip and cold - skip are what the reads add to a step (what the overlap did not hide);
# the summary prints them per batch size.
#
# Here, once (a -DTM_CUDA=ON build folder with bench_engine, test_dsv41_cuda and mkmodel):
#   bash bench/dsv41_device.sh --prep build-cuda .devcarry/h40
# On the device (run's carry: [".devcarry/h40"]):
#   OUT=$OUT B=.devcarry/h40 bash bench/dsv41_engram_overlap.sh [stages...]
# Dry run here (prints the device commands; runs nothing on a GPU):
#   BACKEND=cpu B=build-cuda OUT=/tmp/dsv41ov bash bench/dsv41_engram_overlap.sh
# Stages (default: graphs bench): graphs = test_dsv41_cuda's graph cases (decode steps from the
# engine's graphs bitwise equal to eager ones); bench = the four runs above and the summary.
# Knobs: SEL (bench_engine's layer selection, default empty: one layer of each kind, 7 layers,
# ~57 GB in the fast mode; e.g. SEL="--layers 2" for the exact mode's bf16 experts on an H100),
# PROMPT (tokens, default 128), GEN (decode steps + 1, default 48),
# REPS (best of, default 3). Four bench_engine runs of about a minute each (table writes, random
# weights, 4 x (prefill + 47 decode steps) per batch size).
. "$(dirname "$0")/device_env.sh"
BACKEND=${BACKEND:-cuda}
SEL=${SEL:-}
PROMPT=${PROMPT:-128}
GEN=${GEN:-48}
REPS=${REPS:-3}
B=$(cd "$B" && pwd)
[ -f "$B/bin.tgz" ] && [ ! -x "$B/bench_engine" ] && tar xzf "$B/bin.tgz" -C "$B" # from --prep
stages=${*:-graphs bench}
has() { [[ " $stages " == *" $1 "* ]]; }
if [ "$BACKEND" = cuda ]; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > "$OUT/machine.txt" 2>&1
  cat "$OUT/machine.txt"
fi
echo "backend $BACKEND, binaries $B, layers ${SEL:-(one of each kind)}, prompt $PROMPT, gen $GEN, reps $REPS, stages: $stages"

# run NAME TIMEOUT CMD...: a device command (log $OUT/NAME.log, rc and time), or its dry run
run() {
  local name=$1 to=$2; shift 2
  if [ "$BACKEND" != cuda ]; then
    echo "[dry-run, no GPU] would run: $* > \$OUT/$name.log"
    return
  fi
  local t0; t0=$(date +%s)
  TM_BUILD=$B TM_SRC=$PWD timeout -k 5 "$to" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? in $(( $(date +%s) - t0 )) s"
}

if has graphs; then
  for c in graphs-engram02 graphs-engram13 graphs-no-engram; do
    run "test_$c" 300 env TM_DSV41_ONLY=$c "$B/test_dsv41_cuda"
    [ -f "$OUT/test_$c.log" ] && grep -E "graphs vs eager|FIRST DIFFERENCE|failed|checks" "$OUT/test_$c.log" | head -8
  done
fi

if has bench; then
  read -r -a sel <<< "$SEL"
  common=(--shape dsv41-flash "${sel[@]}" --batch 1,8 --prompt "$PROMPT" --gen "$GEN" --reps "$REPS")
  run bench_skip 400 env TM_DSV41_ENGRAM_SKIP=1 "$B/bench_engine" "${common[@]}" --engram warm
  run bench_warm 400 "$B/bench_engine" "${common[@]}" --engram warm
  run bench_cold 400 "$B/bench_engine" "${common[@]}" --engram cold
  run bench_eager 400 "$B/bench_engine" "${common[@]}" --engram warm --graphs 0
  if [ "$BACKEND" = cuda ]; then
    grep -hE "^dsv41-flash" "$OUT"/bench_{skip,warm,cold,eager}.log
    # decode ms/step per (mode, batch), then what the reads add over skip
    for m in skip warm cold eager; do
      sed -nE "s/^dsv41-flash B=([0-9]+) .*decode ([0-9.]+) ms\/step.*/$m \1 \2/p" "$OUT/bench_$m.log"
    done > "$OUT/decode_ms.txt"
    awk '{ms[$1 " " $2] = $3}
         END {
           for (b = 1; b <= 8; b += 7) {
             s = ms["skip " b]; w = ms["warm " b]; c = ms["cold " b]; e = ms["eager " b];
             if (s == "") continue;
             printf "B=%d decode ms/step: skip %.3f, warm %.3f (+%.3f = %.1f%%), cold %.3f (+%.3f = %.1f%%), eager warm %.3f\n",
                    b, s, w, w - s, 100 * (w - s) / s, c, c - s, 100 * (c - s) / s, e
           }
         }' "$OUT/decode_ms.txt" | tee "$OUT/summary.txt"
  fi
fi
echo "done; outputs in $OUT"
