# tests/kafka/kafka_lib.bash - shared set-up of the Kafka tests (tests/kafka_*.sh); not a test
# itself. Source it right after setting build and src: it skips the test (exit 77) when the Kafka
# tools were not built, makes the work folder $work and removes it at exit, killing the mock
# cluster and every pid the test added to the array pids. The tests that run jobs source
# durable_lib.sh after it (the tiny model). It defines:
#   kin_mock TOPIC:N...   start tools/kafka_mock in its own process (it outlives tokenmill kills);
#                         sets $bs; fault commands go to fd 3 ("down 1", "up 1")
#   kin_input N           $work/data/in.jsonl: N records with unique ids; every 50th line is bad
#                         JSON and every 50th + 25 lacks its prompt (error records)
#   kin_job JOB DIR GROUP [OUTPUT_KAFKA_JSON]  a job reading topic $kin_topic (default jobs) in
#                         drain mode (TM_KAFKA_DEBUG=cgrp,... sets librdkafka's debug contexts)
#   kin_split TOPIC N_PART  the topic read back as per-partition files $work/parts/P.jsonl (line
#                         offset + 1 = the message at that offset), the verify oracle's inputs
#   kin_topic_as_dir TOPIC DIR [--dedupe]  $work/t, an output folder for the oracle: completions
#                         from the output topic (one copy per record id with --dedupe; prints the
#                         number of copies removed), errors.jsonl and metrics.json from DIR
#   kin_merge [--dedupe] DIR...  $work/merged: the folders' completions and errors, so
#                         tests/oracles/verify_outputs.cjs checks them as one output; each folder's
#                         metrics must match its records and no record may repeat in one folder;
#                         --dedupe keeps one copy of a record found in several folders ($kin_dups)
#   kin_verify DIR        the exactly-once oracle over DIR with the per-partition inputs
#   kin_offsets_ok GROUP DIR...  the group's committed offsets never pass a record that is not
#                         done (durable) in one of the folders' manifests
#   kin_drops LOG...      how many records the runs logged as held by a waiting source thread and
#                         dropped at a revoke (the partition's new owner answers them; the union
#                         check of kin_verify shows none is lost)
[ -x "$build/kafka_mock" ] || { echo "kafka tools not built (no librdkafka)"; exit 77; }
work=$(mktemp -d)
mock_pid=""
pids=()
kin_cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    [ -n "$mock_pid" ] && kill "$mock_pid" 2>/dev/null
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap kin_cleanup EXIT

kin_mock() {
    mkfifo "$work/ctl"
    "$build/kafka_mock" --stdin "$@" <"$work/ctl" >"$work/mock.out" 2>"$work/mock.err" &
    mock_pid=$!
    exec 3>"$work/ctl"
    for _ in $(seq 100); do grep -q bootstrap "$work/mock.out" 2>/dev/null && break; sleep 0.1; done
    bs=$(sed -n 's/^bootstrap.servers=//p' "$work/mock.out")
    [ -n "$bs" ] || { echo "mock did not start"; cat "$work/mock.err"; exit 1; }
}

kin_input() {
    mkdir -p "$work/data"
    node -e '
      const n = +process.argv[1], out = [];
      for (let i = 1; i <= n; i++) {
        if (i % 50 === 0) out.push("{\"id\": \"r" + i + "\", \"prompt\": oops}");
        else if (i % 50 === 25) out.push(JSON.stringify({id: "r" + i}));
        else out.push(JSON.stringify({id: "r" + i, prompt: "record " + i + " of the kafka test " +
                                       "x".repeat(i % 17), max_tokens: 1 + (i % 2)}));
      }
      process.stdout.write(out.join("\n") + "\n");' "$1" >"$work/data/in.jsonl"
}

kin_feed() { # N_RECORDS [MAX_TOKENS]: kin_input's records (each asking MAX_TOKENS when given)
    # produced keyed into the mock's topic jobs (4 partitions) and split by partition (kin_split)
    kin_input "$1"
    [ -z "${2:-}" ] || sed -i "s/\"max_tokens\":[12]}/\"max_tokens\":$2}/" "$work/data/in.jsonl"
    "$build/kafka_tool" produce "$bs" jobs "$work/data/in.jsonl" --keyed >/dev/null
    kin_split jobs 4
}

kin_job() { # JOB DIR GROUP [OUTPUT_KAFKA_JSON]
    cat >"$1" <<JOB
{
  "model": "$work/model",
  "input": { "kafka": { "brokers": "$bs", "topics": ["${kin_topic:-jobs}"], "group": "$3",
                        "config": { "session.timeout.ms": "6000", "heartbeat.interval.ms": "500",
                                    "reconnect.backoff.max.ms": "1000"${TM_KAFKA_DEBUG:+, \"debug\": \"$TM_KAFKA_DEBUG\"} } } },
  "output": { "dir": "$2", "commit_every_s": 0.1, "commit_every_records": 64${4:+, \"kafka\": $4} },
  "engine": { "backend": "cpu", "max_seqs": 16, "max_batched_tokens": 512, "block_size": 16,
              "threads": 1, "lookahead": 64 },
  "defaults": { "max_tokens": 1, "temperature": 0 }
}
JOB
}

kin_split() { # TOPIC N_PART
    rm -rf "$work/parts"; mkdir -p "$work/parts"
    "$build/kafka_tool" consume "$bs" "$1" --meta >"$work/parts/all.tsv"
    node -e '
      const fs = require("fs"), [tsv, dir, np] = process.argv.slice(1);
      const parts = Array.from({length: +np}, () => []);
      for (const row of fs.readFileSync(tsv, "utf8").split("\n")) {
        if (!row) continue;
        const [p, o, ...v] = row.split("\t");
        parts[+p][+o] = v.join("\t");
      }
      parts.forEach((rows, p) => {
        for (let i = 0; i < rows.length; i++) if (rows[i] === undefined) throw new Error("gap");
        fs.writeFileSync(dir + "/" + p + ".jsonl", rows.map((r) => r + "\n").join(""));
      });' "$work/parts/all.tsv" "$work/parts" "$2"
    kin_inputs=()
    for ((p = 0; p < $2; p++)); do kin_inputs+=("kafka:$1/$p=$work/parts/$p.jsonl"); done
}

kin_topic_as_dir() { # TOPIC DIR [--dedupe]
    rm -rf "$work/t"; mkdir "$work/t"
    "$build/kafka_tool" consume "$bs" "$1" >"$work/t/raw.jsonl"
    node -e '
      const fs = require("fs"), rows = fs.readFileSync(process.argv[1], "utf8").split("\n")
        .filter(Boolean), seen = new Set(), out = [];
      let dups = 0;
      for (const r of rows) {
        const id = JSON.stringify(JSON.parse(r).id);
        if (seen.has(id) && process.argv[2] === "--dedupe") { dups++; continue; }
        seen.add(id); out.push(r);
      }
      fs.writeFileSync(process.argv[1] + ".out", out.map((r) => r + "\n").join(""));
      console.log(dups);' "$work/t/raw.jsonl" "${3:-}"
    lz4 -q -c "$work/t/raw.jsonl.out" >"$work/t/completions.jsonl.lz4"
    cp "$2/errors.jsonl" "$2/metrics.json" "$work/t/"
}

kin_merge() { # [--dedupe] DIR...: with --dedupe a record answered in several folders is kept
    # once (a rebalance's at-least-once across folders; none may repeat within one folder) and
    # $kin_dups counts the extra copies
    local dedupe="" d
    [ "$1" = --dedupe ] && { dedupe=1; shift; }
    rm -rf "$work/merged"; mkdir -p "$work/merged"
    for d in "$@"; do lz4 -dc "$d/completions.jsonl.lz4" >"$d/.plain"; done
    kin_dups=$(node -e '
      const fs = require("fs"), [out, dedupe, ...dirs] = process.argv.slice(1);
      const seen = new Set(), comp = [], errs = [];
      let dups = 0, inner = 0;
      for (const d of dirs) {
        const mine = new Set(), n = [0, 0];
        const rows = [[d + "/.plain", comp], [d + "/errors.jsonl", errs]];
        for (const [f, list] of rows) {
          if (!fs.existsSync(f)) continue;
          for (const row of fs.readFileSync(f, "utf8").split("\n")) {
            if (!row) continue;
            n[list === comp ? 0 : 1]++;
            const s = JSON.parse(row).source, key = s.topic + "/" + s.partition + ":" + s.offset;
            if (mine.has(key)) inner++;
            mine.add(key);
            if (seen.has(key) && dedupe) { dups++; continue; }
            seen.add(key); list.push(row);
          }
        }
        const r = JSON.parse(fs.readFileSync(d + "/metrics.json", "utf8")).records;
        if (r.ok !== n[0] || r.failed !== n[1]) {
          console.error("FAIL: " + d + " metrics " + r.ok + "/" + r.failed + " != " + n); process.exit(1);
        }
      }
      if (inner) { console.error("FAIL: " + inner + " records twice within one folder"); process.exit(1); }
      fs.writeFileSync(out + "/completions.jsonl", comp.map((r) => r + "\n").join(""));
      fs.writeFileSync(out + "/errors.jsonl", errs.map((r) => r + "\n").join(""));
      const m = {records: {ok: comp.length, failed: errs.length}}; // each folder checked above
      fs.writeFileSync(out + "/metrics.json", JSON.stringify(m));
      console.log(dups);' "$work/merged" "$dedupe" "$@")
    lz4 -q -c "$work/merged/completions.jsonl" >"$work/merged/completions.jsonl.lz4"
    return
}

kin_verify() {
    node "$src/tests/oracles/verify_outputs.cjs" "$1" "${kin_inputs[@]}" >"$work/verify.log" 2>&1 ||
        { cat "$work/verify.log" | tail -20; exit 1; }
}

kin_offsets_ok() { # GROUP DIR...
    local group=$1; shift
    export KIN_TOPIC=${kin_topic:-jobs}
    "$build/kafka_tool" committed "$bs" "$group" "${kin_topic:-jobs}" >"$work/committed.tsv"
    node -e '
      const fs = require("fs"), [tsv, ...dirs] = process.argv.slice(1);
      const done = []; // per folder: "topic/p" -> {next, above}
      for (const d of dirs) {
        const f = d + "/manifest.json";
        if (!fs.existsSync(f)) continue;
        const m = JSON.parse(fs.readFileSync(f, "utf8"));
        for (const k of (m.input_kafka || {partitions: []}).partitions)
          done.push({key: k.topic + "/" + k.partition, next: k.next, above: k.done_above});
      }
      const isDone = (key, o) => done.some((d) => d.key === key &&
        (o < d.next || d.above.some(([a, b]) => o >= a && o <= b)));
      const topic = process.env.KIN_TOPIC || "jobs";
      let bad = 0, checked = 0;
      for (const row of fs.readFileSync(tsv, "utf8").split("\n")) {
        if (!row) continue;
        const [p, c] = row.split("\t").map(Number);
        for (let o = 0; o < c; o++, checked++)
          if (!isDone(topic + "/" + p, o)) { bad++; if (bad < 5) console.error("offset " + o +
            " of " + topic + "/" + p + " is committed (" + c + ") but in no manifest"); }
      }
      if (bad) { console.error("FAIL: " + bad + " committed offsets ahead of durable output"); process.exit(1); }
      console.log(checked);' "$work/committed.tsv" "$@"
}

kin_drops() { # LOG...
    cat "$@" | grep -c "was revoked while waiting for the runner" || true
}
