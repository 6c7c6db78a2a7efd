#!/usr/bin/env bash
# bench/dsv41_device.sh - every GPU-machine stage of issue 40 (DeepSeek-V4.1 on the GPU) in one
# device call, from binaries built here. Logs and outputs go to $OUT.
#
# Here, once (a build folder with mkmodel and test_dsv41; a -DTM_CUDA=ON one adds test_dsv41_cuda
# and bench_engine when they exist). Puts the binaries stripped in DEST/bin.tgz with the libraries
# the device image lacks, and copies DeepSeek's reference files (model.py, engram.py,
# kernel_cpu.py: NOT part of this repository, saved from the public reference by hand, see
# docs/deepseek_v41.md "CUDA") from REF (default /work/ref/deepseek_v41) into DEST/ref with a
# MANIFEST.md saying where each came from and its sha256. DEST (default .devcarry/h40) is added to
# .git/info/exclude, so none of it is ever committed:
#   bash bench/dsv41_device.sh --prep build-cuda [.devcarry/h40] [/work/ref/deepseek_v41]
# On the device (run's carry: [".devcarry/h40"]):
#   OUT=$OUT B=.devcarry/h40 bash bench/dsv41_device.sh [stages...]
# Dry run here (the torch and CUDA steps print what they would run; the CPU engine steps run):
#   BACKEND=cpu B=build OUT=/tmp/dsv41dev REF=/work/ref/deepseek_v41 bash bench/dsv41_device.sh
#
# Stages (default: ref cpu cuda engram bench):
#   ref    the reference's quantizers against the NumPy oracle's (--selftest, bit for bit), then
#          DeepSeek's reference (torch, tests/oracles/v41_torch_ref.py) on the mkmodel checkpoints
#          of every tests/fixtures/v41/*.json: on the GPU (device cuda) -> $OUT/v41_torch/*.json,
#          fixtures in the shape of tests/fixtures/v41 (copy them to tests/fixtures/v41_torch/ for
#          CI, see below); the same on torch's CPU -> $OUT/v41_torch_cpu/; each compared with the
#          NumPy oracle's fixture (max |d logprob|, greedy agreement) and cuda with cpu.
#   ref32  the same reference with float32 activations (v41_torch_ref.py --fp32: torch.bfloat16
#          aliased to float32, the quantization points unchanged) on torch's CPU with --dump (each
#          fixture's prefill intermediates -> $OUT/v41_dump32/*.npz) and on the GPU ->
#          $OUT/v41_torch32{,_cuda}/; then the CPU engine against the CPU run's fixtures with
#          V41_LP_TOL=$LP_TOL32 (default 0.01): the semantic check, without bf16 noise.
#   cpu    the CPU engine (test_dsv41, TP 1/2/4) against the torch reference's fixtures:
#          V41_FIXTURES=$OUT/v41_torch V41_LP_TOL=$LP_TOL (default 0.05, a first bound: the torch
#          reference runs bf16 activations, the CPU engine and the NumPy oracle fp32); prints max
#          |d logprob| per fixture. Then the same binary on the NumPy fixtures (the baseline).
#   cuda   test_dsv41_kernels (kernels/dsv41.cu: act_quant / fp4_act_quant QDQ bit-exact, the
#          Engram gate, the indexer's selection, against host references), test_dsv41_engram_stage
#          (Engram rows from the host's tables through pinned memory to the GPU, bit for bit as
#          engram_table_get), then test_dsv41_cuda (CUDA engine = CPU engine
#          on small random V4.1 configs) once it exists.
#   engram Engram rows host -> pinned -> GPU (bench_dsv41_engram_stage) from a 1.06 GB table
#          written by bench_engram (4,000,000 rows of 256), row cache 64 MB (1/16 of the table):
#          16 tokens x 48 rows a step, cold and warm; bench_engram's disk-only figures alongside.
#   bench  bench_engine --shape dsv41-flash, if that shape exists.
# CI afterwards: copy $OUT/v41_torch/*.json to tests/fixtures/v41_torch/ and write the bound the
# cpu stage measured (rounded up) into tests/fixtures/v41_torch/LP_TOL; tests/e2e/e2e_v41_torch.sh
# then checks the CPU engine against the real reference on every ctest run.
set -u
if [ "${1:-}" = "--prep" ]; then
  bld=$(cd "${2:?build folder}" && pwd)
  dst=${3:-.devcarry/h40}
  ref=${4:-/work/ref/deepseek_v41}
  x="$(git rev-parse --git-common-dir)/info/exclude"
  case $dst in /*) ;; *) git check-ignore -q "$dst/x" || echo "/${dst%%/*}/" >> "$x" ;; esac
  rm -rf "$dst"; mkdir -p "$dst/lib" "$dst/bin" "$dst/ref"
  for f in mkmodel test_dsv41; do
    cp "$bld/$f" "$dst/bin/" || { echo "missing $bld/$f"; exit 1; }
  done
  for f in test_dsv41_kernels test_dsv41_engram_stage test_dsv41_cuda bench_engine tokenmill \
    bench_engram bench_dsv41_engram_stage; do
    [ -x "$bld/$f" ] && cp "$bld/$f" "$dst/bin/"
  done
  strip "$dst"/bin/*
  tar czf "$dst/bin.tgz" -C "$dst/bin" . && rm -rf "$dst/bin"
  ldd "$bld/test_dsv41" "$bld/mkmodel" | awk '/jansson|lz4|xxhash|rdkafka|sasl2|utf8proc|icu/ {print $3}' |
    sort -u | while read -r l; do cp -L "$l" "$dst/lib/"; done
  for f in model.py engram.py kernel_cpu.py; do
    cp "$ref/$f" "$dst/ref/" || { echo "missing reference file $ref/$f"; exit 1; }
  done
  {
    echo "# DeepSeek-V4.1 reference files carried to the GPU machine (never committed)"
    echo
    echo "Saved by hand from the public reference with the read_file tool (exact character counts"
    echo "checked against the tool's total_chars), tenstorrent/tt-metal,"
    echo "models/demos/deepseek_v3_d_p/reference/deepseek_v41/ (vendored from"
    echo "huggingface.co/deepseek-ai/DeepSeek-V4.1-Flash, revision dba1be0a40aa45a94ad051997016db3960a90277):"
    echo "- model.py: inference/model.py, read_file id 70871433627 (61957 chars), MIT"
    echo "- engram.py: inference/engram.py, read_file id 71212907549 (8439 chars), MIT"
    echo "- kernel_cpu.py: torch port of inference/kernel.py, read_file id 70946651461 (12725 chars), Apache-2.0"
    echo "image_processor.py and vision.py are not carried: tests/oracles/v41_torch_ref.py writes"
    echo "placeholders for their imported names (vision_n_layers is 0 in mkmodel checkpoints)."
    echo
    echo "sha256:"
    (cd "$dst/ref" && sha256sum model.py engram.py kernel_cpu.py)
  } > "$dst/ref/MANIFEST.md"
  du -sh "$dst"
  exit 0
fi
. "$(dirname "$0")/device_env.sh"
BACKEND=${BACKEND:-cuda}
LP_TOL=${LP_TOL:-0.05}
B=$(cd "$B" && pwd)
[ -f "$B/bin.tgz" ] && [ ! -x "$B/mkmodel" ] && tar xzf "$B/bin.tgz" -C "$B" # from --prep
REF=${REF:-$B/ref}
PY=${PY:-python3}
stages=${*:-ref cpu cuda engram bench}
has() { [[ " $stages " == *" $1 "* ]]; }
FIX=$(ls tests/fixtures/v41/*.json)
fx_args=""
for f in $FIX; do fx_args="$fx_args --fixture $f"; done
n_gpu=0
if [ "$BACKEND" = cuda ]; then
  n_gpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > "$OUT/machine.txt" 2>&1
  cat "$OUT/machine.txt"
fi
has_torch=0
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      "float8_e8m0fnu", hasattr(torch, "float8_e8m0fnu"), "float4_e2m1fn_x2", hasattr(torch, "float4_e2m1fn_x2"))' \
  > "$OUT/torch.txt" 2>&1 && has_torch=1
echo "backend $BACKEND, $n_gpu GPU(s), binaries $B, reference $REF, stages: $stages"
echo "python: $(tail -1 "$OUT/torch.txt")"

# step NAME TIMEOUT CMD...: run a step (log $OUT/NAME.log, rc and time) and show its summary lines
step() {
  local name=$1 to=$2; shift 2
  local t0; t0=$(date +%s)
  TM_BUILD=$B TM_SRC=$PWD PYTHONUNBUFFERED=1 timeout -k 5 "$to" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? in $(( $(date +%s) - t0 )) s"
  grep -E "max \|d logprob\||greedy|checks|FAIL|Error|error|selftest" "$OUT/$name.log" | head -40
}
dry() { echo "[dry-run, no GPU] would run: $*"; }

ref_cmd=("$PY" tests/oracles/v41_torch_ref.py --ref "$REF" --mkmodel "$B/mkmodel")
if has ref; then
  if [ $has_torch = 1 ]; then
    dev=cpu; [ "$BACKEND" = cuda ] && dev=cuda
    step ref_selftest 120 "$PY" tests/oracles/v41_torch_ref.py --ref "$REF" --selftest --device $dev
  else
    dry "$PY tests/oracles/v41_torch_ref.py --ref $REF --selftest --device cuda"
  fi
  if [ "$BACKEND" = cuda ] && [ $has_torch = 1 ]; then
    step ref_torch_cuda 420 "${ref_cmd[@]}" $fx_args --out "$OUT/v41_torch" --device cuda
  else
    dry "${ref_cmd[*]} --fixture tests/fixtures/v41/<each>.json --out \$OUT/v41_torch --device cuda"
  fi
  if [ $has_torch = 1 ]; then
    step ref_torch_cpu 420 "${ref_cmd[@]}" $fx_args --out "$OUT/v41_torch_cpu" --device cpu
    for f in "$OUT"/v41_torch/*.json; do
      [ -f "$f" ] && [ -f "$OUT/v41_torch_cpu/$(basename "$f")" ] || continue
      echo "torch cuda vs torch cpu $(basename "$f" .json): $("$PY" tests/oracles/v41_torch_ref.py \
        --compare "$OUT/v41_torch_cpu/$(basename "$f")" "$f")"
    done
  else
    dry "${ref_cmd[*]} ... --out \$OUT/v41_torch_cpu --device cpu   (no torch in $PY here)"
  fi
fi

if has ref32; then
  if [ $has_torch = 1 ]; then
    step ref32_torch_cpu 300 "${ref_cmd[@]}" $fx_args --out "$OUT/v41_torch32" --device cpu --fp32 \
      --dump "$OUT/v41_dump32"
    if [ "$BACKEND" = cuda ]; then
      step ref32_torch_cuda 300 "${ref_cmd[@]}" $fx_args --out "$OUT/v41_torch32_cuda" --device cuda --fp32
      for f in "$OUT"/v41_torch32_cuda/*.json; do
        [ -f "$f" ] && [ -f "$OUT/v41_torch32/$(basename "$f")" ] || continue
        echo "fp32 torch cuda vs torch cpu $(basename "$f" .json): $("$PY" tests/oracles/v41_torch_ref.py \
          --compare "$OUT/v41_torch32/$(basename "$f")" "$f")"
      done
    fi
    step cpu_engine_vs_torch32 300 env V41_FIXTURES="$OUT/v41_torch32" V41_LP_TOL="${LP_TOL32:-0.01}" \
      "$B/test_dsv41"
  else
    dry "${ref_cmd[*]} ... --out \$OUT/v41_torch32 --device cpu --fp32 --dump \$OUT/v41_dump32; then test_dsv41 against them"
  fi
fi

if has cpu; then
  tdir=$OUT/v41_torch
  [ -n "$(ls "$tdir"/*.json 2>/dev/null)" ] || tdir=$OUT/v41_torch_cpu
  if [ -n "$(ls "$tdir"/*.json 2>/dev/null)" ]; then
    step cpu_engine_vs_torch 500 env V41_FIXTURES="$tdir" V41_LP_TOL="$LP_TOL" "$B/test_dsv41"
  else
    dry "V41_FIXTURES=\$OUT/v41_torch V41_LP_TOL=$LP_TOL $B/test_dsv41   (CPU engine vs the torch reference)"
  fi
  step cpu_engine_vs_numpy 500 "$B/test_dsv41"
fi

if has cuda; then
  for t in test_dsv41_kernels test_dsv41_engram_stage; do
    if [ ! -x "$B/$t" ]; then
      echo "cuda: no $t in $B (prep from a -DTM_CUDA=ON build)"
    elif [ "$BACKEND" = cuda ]; then
      step "$t" 300 "$B/$t"
    else
      dry "$B/$t"
    fi
  done
  if [ ! -x "$B/test_dsv41_cuda" ]; then
    echo "cuda: not run: no test_dsv41_cuda in $B (the CUDA engine for deepseek_v41 is not written yet; the CUDA backend refuses the architecture)"
  elif [ "$BACKEND" = cuda ]; then
    step test_dsv41_cuda 500 "$B/test_dsv41_cuda"
  else
    dry "$B/test_dsv41_cuda"
  fi
fi

if has engram; then
  if [ -x "$B/bench_engram" ] && [ -x "$B/bench_dsv41_engram_stage" ]; then
    if [ "$BACKEND" = cuda ]; then
      et=$(mktemp -d)/engram.safetensors
      step bench_engram 300 "$B/bench_engram" "$et" 4000000 2000 64
      cat "$OUT/bench_engram.log"
      step bench_dsv41_engram_stage 200 "$B/bench_dsv41_engram_stage" "$et" 16 200 64
      cat "$OUT/bench_dsv41_engram_stage.log"
      rm -rf "$(dirname "$et")"
    else # a 1 GB table write is not for the shared CPU box
      dry "$B/bench_engram T.safetensors 4000000 2000 64; $B/bench_dsv41_engram_stage T.safetensors 16 200 64"
    fi
  else
    echo "engram: no bench_engram / bench_dsv41_engram_stage in $B (prep from a -DTM_CUDA=ON build)"
  fi
fi

if has bench; then
  if [ -x "$B/bench_engine" ] && "$B/bench_engine" --help 2>&1 | grep -q dsv41-flash; then
    for bs in 1 8; do
      if [ "$BACKEND" = cuda ]; then
        step "bench_dsv41_b$bs" 300 "$B/bench_engine" --shape dsv41-flash --layers 4 --batch "$bs"
      else
        dry "$B/bench_engine --shape dsv41-flash --layers 4 --batch $bs"
      fi
    done
  else
    echo "bench: not run: bench_engine has no dsv41-flash shape yet"
  fi
fi
echo "done; outputs in $OUT"
