#!/usr/bin/env bash
# bench/shared_prefix.sh [N_SYS] [N_Q] - the shared-prefix benchmark of the scheduler issue:
# N_SYS long system prompts x N_Q questions (default 20 x 100 = 2,000 records), shuffled, run on
# the demo model with the CPU engine three ways: prefix schedule + cache, FCFS + cache, cache off.
# Prints prefill tokens computed, cached tokens and wall time per run (from metrics.json).
# Needs `make demo-random-model` (build/, build/demo-model: random weights) first.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
n_sys=${1:-20}
n_q=${2:-100}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
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

run() { # name schedule prefix_cache
    cat >"$work/$1.json" <<JOB
{ "model": "$top/build/demo-model", "input": { "files": ["$work/data.jsonl"] },
  "output": { "dir": "$work/out-$1" },
  "engine": { "backend": "cpu", "max_seqs": 8, "max_batched_tokens": 4096, "block_size": 128,
              "schedule": "$2", "prefix_cache": $3, "lookahead": 4096 },
  "defaults": { "max_tokens": 4, "temperature": 0 } }
JOB
    "$top/build/tokenmill" -q run "$work/$1.json" >/dev/null
    node -e '
const m = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
console.log([process.argv[2], m.records.ok, m.tokens.prompt, m.engine.prefill_tokens, m.tokens.cached,
  m.time.wall_s.toFixed(1), (m.engine.prefill_tokens / m.tokens.prompt * 100).toFixed(1) + "%"].join(" | "));
' "$work/out-$1/metrics.json" "$1"
}
# Unique prompt tokens = nodes of the token trie of all prompts (BOS included): what a perfect
# prefix cache computes.
node -e 'for (const l of require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean))
  console.log(JSON.stringify({ text: JSON.parse(l).prompt }));' <"$work/data.jsonl" |
    "$top/build/tokenmill" tokenize "$top/build/demo-model" >"$work/ids.jsonl"
uniq=$(node -e '
const root = new Map(); let n = 0;
for (const l of require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean)) {
  let node = root;
  for (const id of [0, ...JSON.parse(l).ids]) { if (!node.has(id)) { node.set(id, new Map()); n++; } node = node.get(id); }
}
console.log(n);' <"$work/ids.jsonl")
echo "records: $(wc -l <"$work/data.jsonl") ($n_sys system prompts x $n_q questions, shuffled); unique prompt tokens (trie): $uniq"
echo "run | records ok | prompt tokens | prefill tokens computed | cached tokens | wall s | computed/prompt"
run prefix prefix true
run fcfs fcfs true
run nocache fcfs false
