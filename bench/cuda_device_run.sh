#!/usr/bin/env bash
# bench/cuda_device_run.sh - on a GPU machine: build with CUDA, run the GPU tests (kernels under
# compute-sanitizer memcheck too), then the engine benchmark (llama8b shape W8 and W1). Logs go
# to $OUT (default ./out-device). Usage: bash bench/cuda_device_run.sh [stages...]
# stages: build test memcheck bench (default: all).
set -u
OUT=${OUT:-out-device}
mkdir -p "$OUT"
B=${B:-build-device}  # or a folder of prebuilt binaries (then skip the build stage)
stages=${*:-build test memcheck bench}
has() { [[ " $stages " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv 2>&1 | tee "$OUT/gpu.txt"
if has build; then
  t0=$(date +%s)
  cmake -S . -B $B -DTM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1 &&
    cmake --build $B -j16 >> "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  echo "build ok in $(( $(date +%s) - t0 )) s"
fi
if has test; then
  $B/test_kernels > "$OUT/test_kernels.log" 2>&1; echo "test_kernels rc=$?"; tail -12 "$OUT/test_kernels.log"
  TM_BUILD=$B TM_SRC=. $B/test_engine_cuda > "$OUT/test_engine_cuda.log" 2>&1
  echo "test_engine_cuda rc=$?"; grep -v '^greedy differs' "$OUT/test_engine_cuda.log" | tail -14
  if [ -f $B/CTestTestfile.cmake ]; then
    (cd $B && ctest -j8 -E 'test_kernels|test_engine_cuda' > "../$OUT/ctest.log" 2>&1); tail -4 "$OUT/ctest.log"
  fi
fi
if has memcheck; then
  if command -v compute-sanitizer > /dev/null; then
    compute-sanitizer --tool memcheck --leak-check full $B/test_kernels > "$OUT/memcheck.log" 2>&1
    echo "memcheck rc=$?"; tail -4 "$OUT/memcheck.log"
  else
    echo "compute-sanitizer not found"
  fi
fi
if has bench; then
  for args in "--batch 8" "--batch 1" "--batch 8 --prompt 2048 --gen 1 --no-ceiling" \
              "--shape llama1b --batch 8" "--shape llama1b --batch 1 --no-ceiling"; do
    echo "== bench_engine $args"
    $B/bench_engine $args 2> "$OUT/bench_stderr.log" | tee -a "$OUT/bench.log"
    tail -2 "$OUT/bench_stderr.log"
  done
fi
