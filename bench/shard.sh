#!/usr/bin/env bash
# bench/shard.sh [N_SHARDS] [N_SYS] [N_Q] - the partitions of docs/sharding.md on the shared-prefix
# job of bench/shared_prefix.sh (N_SYS system prompts x N_Q questions, shuffled; default 4 shards,
# 20 x 100): for each partition, the bytes each shard reads, its records, and the prefill tokens
# computed summed over the shards, against the unsharded job's prefill and the unique prompt tokens
# (the token trie of all prompts, what a perfect prefix cache computes once). Partitions:
#   prefix  tokenmill run --shard K/N (input.shard.by "prefix", the default)
#   id      tokenmill run --shard K/N with input.shard.by "id"
#   bytes   byte ranges aligned to line starts (Hadoop/Spark input splits), simulated: each range
#           is cut into its own file and run as an unsharded job.
# Shards run one after another (this measures tokens and bytes, not time). CPU engine, demo model
# (build/demo-model: `make demo-random-model`).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-4}
n_sys=${2:-20}
n_q=${3:-100}
tm="$top/build/tokenmill"
[ -f "$top/build/demo-model/config.json" ] || { echo "no build/demo-model: make demo-random-model"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The data of bench/shared_prefix.sh (same generator and seed).
node -e '
const [nSys, nQ] = process.argv.slice(1).map(Number);
let s = 12345;
const rnd = () => (s = (s * 1103515245 + 12345) % 2147483648) / 2147483648;
const words = "alpha beta gamma delta ledger parcel invoice route carrier customs refund policy warehouse pallet freight".split(" ");
const sys = [];
for (let i = 0; i < nSys; i++) {
  let t = `System prompt ${i}: you are assistant number ${i}. Rules:`;
  for (let k = 0; k < 220; k++) t += " " + words[Math.floor(rnd() * words.length)];
  sys.push(t + "\n");
}
const recs = [];
for (let i = 0; i < nSys; i++)
  for (let q = 0; q < nQ; q++)
    recs.push({ id: `s${i}-q${q}`, prompt: `${sys[i]}Question ${q}: where is parcel ${Math.floor(rnd() * 1e6)}?` });
for (let i = recs.length - 1; i > 0; i--) { const j = Math.floor(rnd() * (i + 1)); [recs[i], recs[j]] = [recs[j], recs[i]]; }
process.stdout.write(recs.map((r) => JSON.stringify(r)).join("\n") + "\n");
' "$n_sys" "$n_q" >"$work/data.jsonl"
bytes=$(wc -c <"$work/data.jsonl")
node -e 'for (const l of require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean))
  console.log(JSON.stringify({ text: JSON.parse(l).prompt }));' <"$work/data.jsonl" |
    "$tm" tokenize "$top/build/demo-model" >"$work/ids.jsonl"
uniq=$(node -e '
const root = new Map(); let n = 0;
for (const l of require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean)) {
  let node = root;
  for (const id of [0, ...JSON.parse(l).ids]) { if (!node.has(id)) { node.set(id, new Map()); n++; } node = node.get(id); }
}
console.log(n);' <"$work/ids.jsonl")

job() { # file input out [shard-json]
    cat >"$1" <<JOB
{ "model": "$top/build/demo-model", "input": { "files": ["$2"]$4 },
  "output": { "dir": "$3" },
  "engine": { "backend": "cpu", "max_seqs": 8, "max_batched_tokens": 4096, "block_size": 128,
              "schedule": "prefix", "prefix_cache": true, "lookahead": 4096 },
  "defaults": { "max_tokens": 4, "temperature": 0 } }
JOB
}
m() { node -e 'const m = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  console.log(m.records.in + " " + m.engine.prefill_tokens + " " + m.tokens.prompt)' "$1"; }

job "$work/whole.json" "$work/data.jsonl" "$work/out-whole" ""
"$tm" -q run "$work/whole.json" >/dev/null
read -r w_rec w_prefill w_prompt < <(m "$work/out-whole/metrics.json")
echo "input: $(wc -l <"$work/data.jsonl") records ($n_sys system prompts x $n_q questions, shuffled), $bytes bytes"
echo "unique prompt tokens (trie): $uniq; unsharded job: prefill $w_prefill of $w_prompt prompt tokens"
echo
echo "partition | shards | bytes read per shard | records per shard | prefill per shard | prefill summed | summed / unique | summed / unsharded prefill"

report() { # name bytes-list records-list prefill-list
    local sum=0 p
    for p in $4; do sum=$((sum + p)); done
    echo "$1 | $n | $2 | $3 | $4 | $sum | $(node -e "console.log((100 * $sum / $uniq).toFixed(1) + '%')") | $(node -e "console.log((100 * $sum / $w_prefill).toFixed(1) + '%')")"
}
for by in prefix id; do
    job "$work/$by.json" "$work/data.jsonl" "$work/out-$by" ", \"shard\": {\"count\": $n, \"by\": \"$by\"}"
    recs="" pre="" rd=""
    for ((k = 0; k < n; k++)); do
        "$tm" -q run --shard "$k/$n" "$work/$by.json" >/dev/null
        read -r r p _ < <(m "$work/out-$by/shard-$k-of-$n/metrics.json")
        recs="$recs $r" pre="$pre $p" rd="$rd $bytes"
    done
    "$tm" merge "$work/out-$by" >/dev/null
    report "$by" "${rd# }" "${recs# }" "${pre# }"
done
# Byte ranges: range k is [k*B/n, (k+1)*B/n) moved forward to the next line start; each range is a
# file of its own, run unsharded.
node -e '
const fs = require("fs"), [f, n, dir] = [process.argv[1], +process.argv[2], process.argv[3]];
const b = fs.readFileSync(f);
const start = (k) => { if (k === 0) return 0; if (k >= n) return b.length;
  let p = Math.floor(k * b.length / n); while (p < b.length && b[p - 1] !== 10) p++; return p; };
for (let k = 0; k < n; k++) fs.writeFileSync(`${dir}/range${k}.jsonl`, b.subarray(start(k), start(k + 1)));
' "$work/data.jsonl" "$n" "$work"
recs="" pre="" rd=""
for ((k = 0; k < n; k++)); do
    job "$work/range$k.json" "$work/range$k.jsonl" "$work/out-range$k" ""
    "$tm" -q run "$work/range$k.json" >/dev/null
    read -r r p _ < <(m "$work/out-range$k/metrics.json")
    recs="$recs $r" pre="$pre $p" rd="$rd $(wc -c <"$work/range$k.jsonl")"
done
report "bytes" "${rd# }" "${recs# }" "${pre# }"
