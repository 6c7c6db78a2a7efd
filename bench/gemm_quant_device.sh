#!/usr/bin/env bash
# bench/gemm_quant_device.sh - one device call for the quantized decode GEMMs (kernels/gemm_quant.cu):
# build test_gemm_quant and bench_gemm_quant for sm_90, run the test, the small cases of the test
# under compute-sanitizer memcheck, then the benchmark, then the DeepSeek-V4.1 32x32 ue8m0 FP8
# comparison (bench_gemm_quant --block32). Logs in $OUT (build.log, test.log, memcheck.log,
# bench.log, block32.log); a summary on stdout.
#
# Build: with $B holding prebuilt test_gemm_quant and bench_gemm_quant (and $B/lib for missing
# shared libraries, as bench/device_env.sh), those are used and nothing is built. Otherwise the
# tree is configured with cmake -DTM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 into $BD (default
# build-gq) and the two targets built; when that configure fails (the device image lacks jansson
# and other libraries the whole tree needs), the two binaries are compiled directly with nvcc/gcc
# from the only sources they need (kernels/{gemm_quant,gemm_skinny,common}.cu, src/base/err.c).
#
# Usage (repo root, e.g. the device run tool): OUT=$OUT bash bench/gemm_quant_device.sh
#   [stages: build test memcheck bench block32; default all] ; BENCH_ARGS="--reps 50" passes
#   options on (to both benchmark stages). The 32x32 kernel alone: ... gemm_quant_device.sh build
#   test block32
set -u
OUT=${OUT:-out-device}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
stages=${*:-build test memcheck bench block32}
has() { [[ " $stages " == *" $1 "* ]]; }
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/gpu.txt"

if [ -n "${B:-}" ] && [ -x "$B/test_gemm_quant" ] && [ -x "$B/bench_gemm_quant" ]; then
  BIN=$B
  export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "using prebuilt binaries in $B"
elif has build; then
  BD=${BD:-build-gq}
  BIN=$BD
  t0=$(date +%s)
  if cmake -S . -B "$BD" -DTM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1; then
    cmake --build "$BD" -j"$(nproc)" --target test_gemm_quant bench_gemm_quant >> "$OUT/build.log" 2>&1 ||
      { tail -40 "$OUT/build.log"; echo "BUILD FAILED (cmake)"; exit 1; }
    echo "build ok (cmake) in $(( $(date +%s) - t0 )) s"
  else
    echo "cmake configure failed (see build.log); building the two binaries directly" | tee -a "$OUT/build.log"
    mkdir -p "$BD/direct" && rm -f "$BD"/direct/*.o
    CU=${CUDA_HOME:-/usr/local/cuda}
    NVCC="$CU/bin/nvcc -O2 -std=c++17 -lineinfo --generate-code=arch=compute_90,code=[compute_90,sm_90] -I. -Isrc -Xcompiler=-Wall,-Wextra -Werror=all-warnings"
    CC="gcc -O2 -g -std=c11 -D_GNU_SOURCE -DTM_HAVE_CUDA=1 -Wall -Wextra -Werror -I. -Isrc -Itests -I$CU/include"
    ok=1
    for k in gemm_quant gemm_skinny common; do
      $NVCC -c "kernels/$k.cu" -o "$BD/direct/$k.o" >> "$OUT/build.log" 2>&1 &
    done
    wait || true
    for k in gemm_quant gemm_skinny common; do [ -f "$BD/direct/$k.o" ] || ok=0; done
    LIBS="$BD/direct/gemm_quant.o $BD/direct/gemm_skinny.o $BD/direct/common.o src/base/err.c -L$CU/lib64 -lcudart_static -lstdc++ -lm -lpthread -ldl -lrt"
    [ $ok = 1 ] && $CC tests/gpu/test_gemm_quant.c $LIBS -o "$BD/test_gemm_quant" >> "$OUT/build.log" 2>&1 || ok=0
    [ $ok = 1 ] && $CC bench/bench_gemm_quant.c $LIBS -o "$BD/bench_gemm_quant" >> "$OUT/build.log" 2>&1 || ok=0
    [ $ok = 1 ] || { tail -40 "$OUT/build.log"; echo "BUILD FAILED (direct)"; exit 1; }
    echo "build ok (direct nvcc/gcc) in $(( $(date +%s) - t0 )) s"
  fi
else
  BIN=${BD:-build-gq}
fi

if has test; then
  t0=$(date +%s)
  "$BIN/test_gemm_quant" > "$OUT/test.log" 2>&1
  echo "test_gemm_quant rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E 'checks' "$OUT/test.log" | tail -1)"
  grep -E "^(ok|FAIL)|check failed|FAIL:" "$OUT/test.log" | head -20
fi
if has memcheck; then
  if command -v compute-sanitizer > /dev/null; then
    t0=$(date +%s)
    TM_GQ_SMALL=1 compute-sanitizer --tool memcheck "$BIN/test_gemm_quant" > "$OUT/memcheck.log" 2>&1
    echo "memcheck (small cases) rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E 'ERROR SUMMARY|checks' "$OUT/memcheck.log" | tr '\n' ' ')"
  else
    echo "compute-sanitizer not found"
  fi
fi
if has bench; then
  t0=$(date +%s)
  "$BIN/bench_gemm_quant" ${BENCH_ARGS:-} > "$OUT/bench.log" 2> "$OUT/bench_stderr.log"
  echo "bench_gemm_quant rc=$? in $(( $(date +%s) - t0 )) s"
  tail -3 "$OUT/bench_stderr.log"
  # summary: W8 default variants and the MoE cases
  grep -E "^(device|copy)" "$OUT/bench.log"
  grep -E "tok=8 " "$OUT/bench.log" | grep -E "depth=4" | grep -E "var=(skinny|mma) " |
    awk '{print $2, $3, $6, $7, $10, $11, $12}'
  grep -E "fmt=moe" "$OUT/bench.log"
fi
if has block32; then
  t0=$(date +%s)
  "$BIN/bench_gemm_quant" --block32 ${BENCH_ARGS:-} > "$OUT/block32.log" 2> "$OUT/block32_stderr.log"
  echo "bench_gemm_quant --block32 rc=$? in $(( $(date +%s) - t0 )) s"
  tail -3 "$OUT/block32_stderr.log"
  grep -E "^(device|copy)" "$OUT/block32.log"
  grep -E "^case" "$OUT/block32.log" | awk '{print $2, $3, $4, $5, $6, $7, $8, $10, $11, $12}'
fi
