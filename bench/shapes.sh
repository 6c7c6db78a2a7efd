#!/usr/bin/env bash
# bench/shapes.sh - on a GPU machine: W1 and W8 decode (and the P-style prefill of each batch) of
# bench_engine on several public dense shapes, bf16 and FP8 weights, each with its % of the
# bandwidth floor measured in the same process (issue 19: "not only the 8B shape").
# Env: B (folder with bench_engine and lib/), OUT (logs; default out-shapes), SHAPES (names known
# to `bench_engine --help`), QUANTS (default "bf16 fp8-block"), GEN (decode tokens, default 128),
# REPS (default 3). Prints a markdown table; the raw JSON lines are in $OUT/shapes.jsonl.
set -u
B=$(cd "${B:?binaries folder}" && pwd)
OUT=${OUT:-out-shapes}
SHAPES=${SHAPES:-"llama3.2-1b llama3.2-3b llama3.1-8b qwen2.5-7b qwen2.5-14b mistral-7b-v0.3"}
QUANTS=${QUANTS:-"bf16 fp8-block"}
GEN=${GEN:-128}; REPS=${REPS:-3}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
: > "$OUT/shapes.jsonl"
for s in $SHAPES; do
  for q in $QUANTS; do
    "$B/bench_engine" --shape "$s" --quant "$q" --batch 1,8 --gen "$GEN" --reps "$REPS" \
      > "$OUT/$s.$q.log" 2> "$OUT/$s.$q.err" || { echo "$s $q: failed"; tail -3 "$OUT/$s.$q.err"; }
    grep '^{' "$OUT/$s.$q.log" >> "$OUT/shapes.jsonl"
  done
done
python3 - "$OUT/shapes.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| shape | weights | B | GB/step | ms/step | floor ms | above floor ms | tok/s aggregate | % of floor | prefill tok/s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print("| %s | %s | %d | %.2f | %.3f | %.3f | %.3f | %.1f | %.1f%% | %.0f |" % (
        r["shape"], r["quant"], r["B"], r["w_gb"], r["step_ms"], r["floor_ms"],
        r["step_ms"] - r["floor_ms"], r["decode_tok_s"], r["pct_ceiling"],
        r["B"] * r["L"] / (r["ttft_ms"] * 1e-3)))
by = {}
for r in rows:
    by[(r["shape"], r["B"], r["quant"])] = r
print()
for (s, b, q), r in sorted(by.items()):
    if q != "bf16" and (s, b, "bf16") in by:
        base = by[(s, b, "bf16")]
        print("%s B%d: %s / bf16 decode %.2fx, prefill %.2fx" % (
            s, b, q, base["step_ms"] / r["step_ms"], base["ttft_ms"] / r["ttft_ms"]))
PY
