#!/usr/bin/env bash
# bench/gpu_session.sh - one device call for every GPU stage of a session: the CUDA regression
# tests, issue 41's DeepSeek-V4 tensor-parallel checks (bench/dsv4_tp_device.sh), issue 40's V4.1
# stages (bench/dsv41_device.sh: the torch reference, the CPU engine against it, the V4.1 kernels
# and Engram staging, the V4.1 CUDA engine when built), DeepSeek-V4 decode figures with an Nsight
# Compute profile of one eager decode step. Everything from binaries built on the CPU machine.
#
# Here, once, from a -DTM_CUDA=ON build folder (one carry folder for all parts; the binaries go
# into one xz tarball, whose 64 MiB window stores the kernels every binary links only once: ~10 MB
# instead of ~160 MB; DEST is git-ignored through .git/info/exclude):
#   bash bench/gpu_session.sh --prep build [.devcarry/gpu] [/work/ref/deepseek_v41]
# On the device (run's carry: [".devcarry/gpu"]):
#   OUT=$OUT B=.devcarry/gpu bash bench/gpu_session.sh [parts...]
# Dry run here (CPU engine parts run, GPU steps print what they would run):
#   BACKEND=cpu OUT=/tmp/gs B=.devcarry/gpu bash bench/gpu_session.sh
# SANITY_TESTS: the sanity part's test binaries (default: the kernel and Llama-engine ones).
# Parts (default: v41ref tp v41gpu sanity perf engram; on request: v41ref32 (the float32 reference),
# v41kill and v41job (bench/dsv41_cuda_job.sh: kill -9 + resume, job vs bench), v41perf (V4.1
# decode: exact vs fast, the Engram overlap), v41ncu (ncu of one fast decode step), gq32 (bench_gemm_quant --block32)), each under its own time limit (LIMIT_<part>
# seconds). Logs: /tmp/gslog/<part>/..., packed into $OUT/logs.tgz after every part (a call cut
# short still brings back what finished), one line per step in $OUT/summary.txt.
set -u
if [ "${1:-}" = "--prep" ]; then
  bld=$(cd "${2:?CUDA build folder}" && pwd)
  dst=${3:-.devcarry/gpu}
  ref=${4:-/work/ref/deepseek_v41}
  here=$(cd "$(dirname "$0")" && pwd)
  t40=$(mktemp -d) t41=$(mktemp -d)
  bash "$here/dsv41_device.sh" --prep "$bld" "$t40/c" "$ref" > /dev/null || exit 1
  bash "$here/dsv4_tp_device.sh" --prep "$bld" "$t41/c" > /dev/null || exit 1
  x="$(git rev-parse --git-common-dir)/info/exclude"
  case $dst in /*) ;; *) git check-ignore -q "$dst/x" || echo "/${dst%%/*}/" >> "$x" ;; esac
  rm -rf "$dst"; mkdir -p "$dst/bin"
  cp -r "$t41/c/lib" "$t41/c/tok" "$t40/c/ref" "$dst/"
  cp -n "$t40"/c/lib/* "$dst/lib/"
  tar xzf "$t40/c/bin.tgz" -C "$dst/bin"
  tar xzf "$t41/c/bin.tgz" -C "$dst/bin"
  for f in test_kernels test_attn_prefill test_engine_cuda test_sample_cuda test_plp_cuda \
    test_gemm_quant test_lt_fp8 bench_gemm_quant test_dsv41_ops; do
    [ -x "$bld/$f" ] && cp "$bld/$f" "$dst/bin/" && strip "$dst/bin/$f"
  done
  tar cf - -C "$dst/bin" . | xz -9 -T1 > "$dst/bin.txz" && rm -rf "$dst/bin" "$t40" "$t41"
  du -sh "$dst"
  exit 0
fi
OUT=${OUT:-out-device}
B=${B:-.devcarry/gpu}
BACKEND=${BACKEND:-cuda}
mkdir -p "$OUT"
L=/tmp/gslog
rm -rf "$L"; mkdir -p "$L"
if [ -f "$B/bin.txz" ] && [ ! -x "$B/tokenmill" ]; then
  if command -v xz > /dev/null; then
    xz -dc "$B/bin.txz" | tar xf - -C "$B"
  else
    python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' \
      "$B/bin.txz" | tar xf - -C "$B"
  fi
fi
parts=${*:-v41ref tp v41gpu sanity perf engram}
S=$OUT/summary.txt
: > "$S"
pack() { tar czf "$OUT/logs.tgz" -C /tmp gslog 2> /dev/null; }
note() { echo "$*" | tee -a "$S"; }
note "gpu_session $(date -u +%FT%TZ) backend $BACKEND parts: $parts, commit $(git rev-parse --short HEAD 2> /dev/null)"
[ "$BACKEND" = cuda ] && note "$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader 2>&1)"

# part NAME LIMIT CMD...: one part under its time limit, its output in $L/NAME.txt and summary
part() {
  local name=$1 lim=$2; shift 2
  local t0; t0=$(date +%s)
  mkdir -p "$L/$name"
  timeout -k 5 "$lim" "$@" > "$L/$name.txt" 2>&1
  local rc=$?
  note "== $name rc=$rc in $(( $(date +%s) - t0 )) s (limit $lim)"
  grep -E "rc=|checks|FAIL|greedy|max \|d|job |torch|not run|dry-run|GiB/s|GB/s|tok/s|ms/step|floor|exactly-once|equal to|checkpoint" "$L/$name.txt" |
    head -40 | sed 's/^/  /' | tee -a "$S"
  pack
}
gpu_tests_part() {
  local t
  for t in "$@"; do
    if [ ! -x "$B/$t" ]; then echo "$t: not built"; continue; fi
    if [ "$BACKEND" != cuda ]; then echo "[dry-run, no GPU] would run: $B/$t"; continue; fi
    local t0; t0=$(date +%s)
    TM_BUILD=$B TM_SRC=$PWD timeout -k 5 240 "$B/$t" > "$L/sanity/$t.log" 2>&1
    echo "$t rc=$? in $(( $(date +%s) - t0 )) s $(grep -E 'checks' "$L/sanity/$t.log" | tail -1)"
    grep -E "FAIL" "$L/sanity/$t.log" | head -5
  done
}
# ncu_steps DIR LAYERS BENCH_ARGS...: Nsight Compute of bench_engine BENCH_ARGS at batch 1 and 8
# (a prefill and one decode step), every kernel's time; DIR/ncu_b<B>.txt sums them by kernel name
# over LAYERS layers (bench/dsv4_ncu_summary.py)
ncu_steps() {
  local dir=$1 nl=$2; shift 2
  local NCU; NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  mkdir -p "$dir"
  for b in 1 8; do
    timeout 120 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
      "$B/bench_engine" "$@" --batch $b --gen 2 --reps 1 > "$dir/ncu_b$b.csv" 2> "$dir/ncu_b$b.err"
    echo "ncu b$b rc=$?"
    python3 bench/dsv4_ncu_summary.py "$dir/ncu_b$b.csv" "$nl" > "$dir/ncu_b$b.txt" 2>&1
    head -24 "$dir/ncu_b$b.txt"
  done
}
export -f ncu_steps
perf_part() {
  local be=$B/bench_engine
  if [ "$BACKEND" != cuda ]; then
    echo "[dry-run, no GPU] would run: $be --shape dsv4-flash --layers 8 --batch 1,8 --prompt 512 --gen 64 --reps 2; ncu of one eager decode step at batch 1 and 8 (4 layers)"
    return 0
  fi
  export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  timeout 120 "$be" --shape dsv4-flash --layers 8 --batch 1,8 --prompt 512 --gen 64 --reps 2 2>&1 |
    grep -v "I cuda"
  TM_DSV4_NO_GRAPHS=1 ncu_steps "$L/perf" 4 --shape dsv4-flash --layers 4 --prompt 512
}
has() { [[ " $parts " == *" $1 "* ]]; }
export B BACKEND L
export -f gpu_tests_part perf_part
if has v41ref; then
  part v41ref "${LIMIT_v41ref:-240}" env OUT="$L/v41ref" bash bench/dsv41_device.sh ref cpu
fi
if has v41ref32; then
  part v41ref32 "${LIMIT_v41ref32:-300}" env OUT="$L/v41ref32" bash bench/dsv41_device.sh ref32
fi
if has tpbisect; then
  mkdir -p "$L/tpbisect"
  part tpbisect "${LIMIT_tpbisect:-240}" env OUT="$L/tpbisect" bash bench/dsv4_tp_bisect.sh
fi
if has tp; then
  part tp "${LIMIT_tp:-200}" env OUT="$L/tp" bash bench/dsv4_tp_device.sh unit test job nccl
fi
if has v41gpu; then
  part v41gpu "${LIMIT_v41gpu:-150}" env OUT="$L/v41gpu" bash bench/dsv41_device.sh cuda bench
fi
if has sanity; then
  . bench/device_env.sh
  part sanity "${LIMIT_sanity:-200}" bash -c 'gpu_tests_part "$@"' _ ${SANITY_TESTS:-test_kernels \
    test_attn_prefill test_engine_cuda test_sample_cuda test_plp_cuda test_gemm_quant test_lt_fp8}
fi
if has perf; then
  part perf "${LIMIT_perf:-200}" bash -c perf_part
fi
if has v41kill; then
  part v41kill "${LIMIT_v41kill:-150}" env OUT="$L/v41kill" bash bench/dsv41_cuda_job.sh kill
fi
if has v41job; then
  part v41job "${LIMIT_v41job:-300}" env OUT="$L/v41job" TOK="$B/tok" bash bench/dsv41_cuda_job.sh jvb
fi
# V4.1 decode figures: the exact engine (the baseline) and the fast one at batch 1 and 8, the
# Engram overlap runs (bench/dsv41_engram_overlap.sh)
v41perf_part() {
  # the released V4.1-Flash layers: exact vs fast on the first two (bf16 experts are 27 GB a layer),
  # then the fast mode on one layer of each kind (bench_engine's default, 7 layers)
  local be=$B/bench_engine c=(--shape dsv41-flash --batch 1,8 --prompt 128 --gen 48 --reps 3)
  if [ "$BACKEND" != cuda ]; then
    echo "[dry-run, no GPU] would run: TM_DSV41_CUDA_EXACT=1 $be ${c[*]} --layers 2; $be ${c[*]} --layers 2; bench/dsv41_engram_overlap.sh bench"
    return 0
  fi
  export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  TM_DSV41_CUDA_EXACT=1 timeout 150 "$be" "${c[@]}" --layers 2 --engram warm 2>&1 |
    grep -E "^dsv41-flash|create|error" | sed 's/^/exact: /'
  timeout 100 "$be" "${c[@]}" --layers 2 --engram warm 2>&1 |
    grep -E "^dsv41-flash|create|error" | sed 's/^/fast: /'
  OUT=$L/v41perf bash bench/dsv41_engram_overlap.sh bench 2>&1 | grep -vE "^\[|I cuda"
}
export -f v41perf_part
if has v41perf; then
  part v41perf "${LIMIT_v41perf:-420}" bash -c v41perf_part
fi
# Nsight Compute of one eager fast decode step (and its prefill) at batch 1 and 8 on the default
# layers (one of each kind): the kernels' times, summed by name (bench/dsv4_ncu_summary.py)
v41ncu_part() {
  local be=$B/bench_engine
  if [ "$BACKEND" != cuda ]; then
    echo "[dry-run, no GPU] would run: ncu of $be --shape dsv41-flash --batch 1|8 --prompt 128 --gen 2 --reps 1 --graphs 0"
    return 0
  fi
  export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  ncu_steps "$L/v41ncu" 7 --shape dsv41-flash --prompt 128 --graphs 0
}
export -f v41ncu_part
if has v41ncu; then
  part v41ncu "${LIMIT_v41ncu:-250}" bash -c v41ncu_part
fi
if has gq32; then
  . bench/device_env.sh
  part gq32 "${LIMIT_gq32:-120}" bash -c '[ "$BACKEND" = cuda ] && "$B/bench_gemm_quant" --block32 || echo "[dry-run, no GPU] would run: $B/bench_gemm_quant --block32"'
fi
if has engram; then
  part engram "${LIMIT_engram:-120}" env OUT="$L/engram" bash bench/dsv41_device.sh engram
fi
# the torch reference's fixtures, for tests/fixtures/v41_torch (small json files)
if [ -d "$L/v41ref/v41_torch" ]; then
  tar czf "$OUT/v41_torch.tgz" -C "$L/v41ref" v41_torch $(cd "$L/v41ref" && ls -d v41_torch_cpu 2> /dev/null)
fi
if [ -n "$(ls -d "$L"/v41ref32/v41_torch32 2> /dev/null)" ]; then
  tar czf "$OUT/v41_torch32.tgz" -C "$L/v41ref32" $(cd "$L/v41ref32" && ls -d v41_torch32* v41_dump32 2> /dev/null)
fi
pack
note "gpu_session done $(date -u +%FT%TZ)"
