#!/usr/bin/env bash
# tests/e2e/e2e_engram_rss.sh BUILD SRC - DeepSeek-V4.1's Engram tables are read from disk into a
# bounded row cache, so `tokenmill run`'s peak RSS does not grow with the tables: two random
# checkpoints (mkmodel --arch deepseek_v41) identical but for the Engram rows, 2,000 vs 400,000 a
# table (dim 256: 0.5 MB vs 106 MB a table, 211 MB both, >= 10x engram_cache_mb), run on the same
# records with engine.engram_cache_mb 4; the large one's peak RSS (ru_maxrss of the child) must
# stay within the small one's + 2 tables x 4 MiB + 16 MiB of slack. Reading the rows through a
# mapping, or loading the tables, would add the touched pages (the whole 211 MB was resident so).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
command -v python3 >/dev/null || { echo "no python3"; exit 77; }
# The V4.1 model maker (h34hash) and CPU engine (h34eng) arrive on other branches: until both are
# merged there is nothing to run.
[ -f "$src/tools/mkmodel_dsv41.c" ] && [ -f "$src/src/runner/engine/cpu/dsv41.c" ] ||
    { echo "no deepseek_v41 mkmodel or CPU engine in this tree"; exit 77; }
say() { echo "e2e_engram_rss: $*"; }
for rows in 2000 400000; do
    "$build/mkmodel" --arch deepseek_v41 --out "$work/m$rows" --seed 5 --engram-dim 256 \
        --engram-heads 4 --engram-rows "$rows" >/dev/null
done
python3 - "$work/data.jsonl" <<'PY'
import json, sys
words = "the cafe naive hello world token mill abc fi ss uber".split()
with open(sys.argv[1], "w") as f:
    for i in range(16):
        p = " ".join(words[(i * 7 + j * 3) % len(words)] + str(j % 13) for j in range(40))
        f.write(json.dumps({"id": "r%d" % i, "prompt": p, "max_tokens": 24}) + "\n")
PY
peak() { # ROWS -> peak RSS (KiB) of tokenmill run on model ROWS
    cat >"$work/job$1.json" <<JOB
{
  "model": "$work/m$1",
  "input": { "files": ["$work/data.jsonl"] },
  "output": { "dir": "$work/out$1" },
  "engine": { "backend": "cpu", "max_seqs": 4, "max_batched_tokens": 64, "threads": 2,
              "engram_cache_mb": 4 },
  "defaults": { "max_tokens": 24, "temperature": 0 }
}
JOB
    python3 - "$build/tokenmill" "$work/job$1.json" "$work/run$1.log" <<'PY'
import resource, subprocess, sys
with open(sys.argv[3], "w") as log:
    rc = subprocess.run([sys.argv[1], "run", sys.argv[2]], stdout=log, stderr=log).returncode
if rc != 0:
    sys.exit("tokenmill run failed (%d), see %s" % (rc, sys.argv[3]))
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
PY
}
small=$(peak 2000)
large=$(peak 400000)
table=$(stat -c %s "$work/m400000/model-00002-of-00002.safetensors")
bound=$((small + 2 * 4096 + 16384))
say "tables $table bytes; peak RSS small tables $small KiB, large tables $large KiB (bound $bound KiB)"
[ "$large" -le "$bound" ] || { say "FAIL: peak RSS grew with the tables"; exit 1; }
say "ok"
