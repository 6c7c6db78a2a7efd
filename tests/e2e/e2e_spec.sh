#!/usr/bin/env bash
# tests/e2e/e2e_spec.sh BUILD_DIR SOURCE_DIR - speculative decoding (issue 25) through
# `tokenmill run` on the trained demo model: jobs/demo_spec.json (copy-heavy prompts, greedy) and
# jobs/demo.json (sampled, stop strings) give the same records with engine.speculative on and off
# (timing and usage.speculative aside); the copy-heavy job accepts most drafts in fewer steps;
# metrics.json, the completions and the job files validate against the schemas (ajv), the
# Prometheus textfile and the HTML report carry the counters; "mtp" drafts (a small mkmodel
# DeepSeek-V4 checkpoint with an MTP layer) give the same records on and off, with method "mtp" in
# metrics.json; "mtp" on a model without an MTP layer and bad values are refused, naming the field.
set -euo pipefail
build=${1:?build dir}
src=${2:?source dir}
tm="$build/tokenmill"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
say() { echo "e2e_spec: $*"; }
bad() { say "FAIL: $*"; fail=1; }

spec='{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 5}'
# job JSON from a job file: output dir, speculative on/off, extra output keys
mkjob() { # SRC_JOB OUT_DIR on|off EXTRA_OUTPUT_JSON
    python3 - "$1" "$2" "$3" "$4" "$spec" <<'PY'
import json, os, sys
src, out, onoff, extra, spec = sys.argv[1:]
j = json.load(open(src))
base = os.path.dirname(os.path.abspath(src))
j["model"] = os.path.normpath(os.path.join(base, j["model"]))
j["input"]["files"] = [os.path.normpath(os.path.join(base, f)) for f in j["input"]["files"]]
j["output"] = dict({"dir": out}, **json.loads(extra or "{}"))
j["engine"]["threads"] = 2
j["engine"].pop("speculative", None)
if onoff == "on":
    j["engine"]["speculative"] = json.loads(spec)
print(json.dumps(j))
PY
}
canon() { # OUT_DIR -> sorted records without timing and usage.speculative
    lz4 -dc "$1/completions.jsonl.lz4" | python3 -c '
import json, sys
rows = []
for l in sys.stdin:
    o = json.loads(l)
    o.pop("timing", None)
    o["usage"].pop("speculative", None)
    o["usage"].pop("cached_tokens", None)
    rows.append(json.dumps(o, sort_keys=True))
print("\n".join(sorted(rows)))'
}

for job in demo_spec demo; do
    for s in off on; do
        extra='{}'
        [ "$s" = on ] && extra="{\"prometheus_textfile\": \"$tmp/$job.prom\"}"
        mkjob "$src/jobs/$job.json" "$tmp/out_${job}_$s" $s "$extra" >"$tmp/${job}_$s.json"
        "$tm" run "$tmp/${job}_$s.json" >"$tmp/${job}_$s.log" 2>&1 || { cat "$tmp/${job}_$s.log"; bad "$job $s run"; }
    done
    if cmp -s <(canon "$tmp/out_${job}_off") <(canon "$tmp/out_${job}_on"); then
        say "$job: records identical with speculation on and off"
    else
        bad "$job: records differ with speculation on and off"
        diff <(canon "$tmp/out_${job}_off") <(canon "$tmp/out_${job}_on") | head -5
    fi
    grep -q 'tokenmill_spec_decode_num_accepted_tokens_total{' "$tmp/$job.prom" || bad "$job: textfile lacks the counters"
done

# The copy-heavy job: most drafts accepted, fewer steps; per-record counts sum to the job's.
python3 - "$tmp/out_demo_spec_on/metrics.json" "$tmp/out_demo_spec_off/metrics.json" <<'PY' || fail=1
import json, sys
on, off = (json.load(open(p)) for p in sys.argv[1:])
s = on["speculative"]
print("e2e_spec: copy job: %d drafts, %d/%d accepted (%.1f%%), mean acceptance length %.2f, "
      "steps %d vs %d, per position %s" % (s["num_drafts"], s["num_accepted_tokens"],
      s["num_draft_tokens"], 100 * s["acceptance_rate"], s["mean_acceptance_length"],
      on["engine"]["steps"], off["engine"]["steps"], s["acceptance_rate_per_pos"]))
ok = s["method"] == "ngram" and s["num_speculative_tokens"] == 5 and off["speculative"] is None
ok = ok and s["acceptance_rate"] > 0.5 and s["mean_acceptance_length"] > 2.5
ok = ok and on["engine"]["steps"] < 0.6 * off["engine"]["steps"]
ok = ok and sum(s["num_accepted_tokens_per_pos"]) == s["num_accepted_tokens"]
ok = ok and on["tokens"]["completion"] == off["tokens"]["completion"]
sys.exit(0 if ok else 1)
PY
lz4 -dc "$tmp/out_demo_spec_on/completions.jsonl.lz4" | python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["speculative"]
t = [0, 0, 0]
for l in sys.stdin:
    u = json.loads(l)["usage"]["speculative"]
    t = [t[0] + u["num_drafts"], t[1] + u["num_draft_tokens"], t[2] + u["num_accepted_tokens"]]
sys.exit(0 if t == [m["num_drafts"], m["num_draft_tokens"], m["num_accepted_tokens"]] else 1)
' "$tmp/out_demo_spec_on/metrics.json" || bad "per-record usage.speculative does not sum to metrics.json"
lz4 -dc "$tmp/out_demo_spec_off/completions.jsonl.lz4" | grep -q '"speculative"' && bad "speculative usage in a job without it"

# HTML report
"$tm" report -o "$tmp/r.html" "$tmp/out_demo_spec_on/metrics.json" >/dev/null 2>&1 || bad "report"
grep -q '<dt>speculative</dt>' "$tmp/r.html" || bad "report lacks the speculative line"

# MTP drafts: a small random DeepSeek-V4 checkpoint with an MTP layer (the demo tokenizer), the
# copy-heavy job's records with greedy and with sampled defaults, on and off.
"$build/mkmodel" --out "$tmp/dsv4" --arch deepseek_v4 --tokenizer "$src/models/demo-pystdlib" \
    --hidden 32 --heads 4 --head-dim 16 --o-groups 2 --o-lora 8 --q-lora 16 --ff 16 --ctx 1024 \
    --window 8 --index-heads 4 --index-dim 8 --index-topk 3 --rope-dim 4 --experts 4 \
    --experts-used 2 --hca-ratio 16 --hc 2 --dtype f32 --seed 5 --layers 2 --dsv4-layers sc \
    --dsv4-mlp hm --dsv4-mtp cm --dsv4-mtp-copy 1 >/dev/null || bad "mkmodel dsv4"
for t in 0 0.8; do
    for s in off on; do
        python3 - "$tmp/demo_spec_$s.json" "$tmp/dsv4" "$tmp/out_mtp_${t}_$s" "$t" >"$tmp/mtp_${t}_$s.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["model"], j["output"]["dir"] = sys.argv[2], sys.argv[3]
j["defaults"] = {"max_tokens": 24, "temperature": float(sys.argv[4]), "seed": 3}
j["engine"]["max_seqs"] = 4
if "speculative" in j["engine"]:
    j["engine"]["speculative"] = {"method": "mtp", "num_speculative_tokens": 3}
print(json.dumps(j))
PY
        "$tm" run "$tmp/mtp_${t}_$s.json" >"$tmp/mtp_${t}_$s.log" 2>&1 || { cat "$tmp/mtp_${t}_$s.log"; bad "mtp $t $s run"; }
    done
    if cmp -s <(canon "$tmp/out_mtp_${t}_off") <(canon "$tmp/out_mtp_${t}_on"); then
        say "mtp, temperature $t: records identical with speculation on and off"
    else
        bad "mtp, temperature $t: records differ with speculation on and off"
    fi
    python3 - "$tmp/out_mtp_${t}_on/metrics.json" <<'PY' || bad "mtp $t: metrics.json speculative"
import json, sys
s = json.load(open(sys.argv[1]))["speculative"]
print("e2e_spec: mtp: %d drafts, %d/%d accepted" % (s["num_drafts"], s["num_accepted_tokens"],
      s["num_draft_tokens"]))
sys.exit(0 if s["method"] == "mtp" and s["num_speculative_tokens"] == 3 and s["num_drafts"] > 0
         and sum(s["num_accepted_tokens_per_pos"]) == s["num_accepted_tokens"] else 1)
PY
done

# Refused: mtp on a model without an MTP layer, num_speculative_tokens out of range, min > max, unknown key
refuse() { # SPEC_JSON EXPECTED_TEXT
    python3 - "$tmp/demo_spec_on.json" "$1" "$tmp/out_refused_$n_ref" >"$tmp/refuse.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["engine"]["speculative"] = json.loads(sys.argv[2])
j["output"]["dir"] = sys.argv[3]
print(json.dumps(j))
PY
    if "$tm" run "$tmp/refuse.json" >"$tmp/refuse.log" 2>&1; then
        bad "accepted $1"
    elif ! grep -q -- "$2" "$tmp/refuse.log"; then
        cat "$tmp/refuse.log"
        bad "refusal of $1 does not say '$2'"
    fi
    cp "$tmp/refuse.json" "$tmp/refused_$((++n_ref)).json"
}
n_ref=0
refuse '{"method": "mtp", "num_speculative_tokens": 1}' 'engine.speculative.method: "mtp" needs a DeepSeek-V4 model'
refuse '{"method": "ngram", "num_speculative_tokens": 17}' 'engine.speculative.num_speculative_tokens'
refuse '{"method": "ngram"}' 'engine.speculative.num_speculative_tokens: required'
refuse '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 3}' 'prompt_lookup_min'
refuse '{"method": "ngram", "num_speculative_tokens": 2, "lookup": 3}' 'engine.speculative.lookup: unknown key'

# Schemas (ajv), when node and the pinned ajv are there
v="$src/tests/oracles/validate_schema.cjs"
if command -v node >/dev/null 2>&1 && [ -d "$src/third_party/npm/node_modules/ajv" ]; then
    node "$v" "$src/schemas/metrics.schema.json" "$tmp/out_demo_spec_on/metrics.json" \
        "$tmp/out_demo_spec_off/metrics.json" "$tmp/out_demo_on/metrics.json" \
        "$tmp/out_mtp_0_on/metrics.json" || bad "metrics schema"
    lz4 -dc "$tmp/out_demo_spec_on/completions.jsonl.lz4" >"$tmp/c.jsonl"
    node "$v" --jsonl "$src/schemas/output.schema.json" "$tmp/c.jsonl" || bad "output schema"
    node "$v" "$src/schemas/job.schema.json" "$tmp/demo_spec_on.json" "$src/jobs/demo_spec.json" || bad "job schema"
    # the refused specs are invalid by the schema too, but for mtp (valid: refused for the model)
    # and min > max (which a schema cannot compare)
    node "$v" --invalid "$src/schemas/job.schema.json" "$tmp"/refused_{2,3,5}.json || bad "schema accepts a refused spec"
else
    say "schema checks skipped: node or ajv missing"
fi
[ $fail -eq 0 ] && say "ok"
exit $fail
