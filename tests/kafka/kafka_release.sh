#!/usr/bin/env bash
# tests/kafka/kafka_release.sh BUILD SRC - a rebalance releases the records read ahead from the
# revoked partitions that the runner has not started (issue 39; label kafka). Consumer A (drain
# mode, folder a, max_read_ahead 10, one sequence at a time) reads 10 records of each of the 4
# partitions of jobs and works through them slowly; consumer B (same group, folder b) joins while
# they are queued. At the revoke A releases the queued records of the revoked partitions: it logs
# them with their offsets and does not answer them; the partitions' next owners (B, or A again
# for the partitions it gets back) read and answer them. Checked:
#   - A released records (the log lines, metrics.json kafka.released);
#   - every released record is answered exactly once over both folders (the release removed, A
#     answers them and so does their next reader: twice);
#   - no record twice within a folder, and the union answers every record (the exactly-once
#     oracle; records A answered past its last accepted offset commit may be answered by both:
#     the mock refuses commits while the group rebalances; at-least-once across folders).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
. "$src/tests/kafka/kafka_lib.bash"
. "$src/tests/e2e/durable_lib.sh"
dur_setup 5 # the tiny model
kin_mock jobs:4
kin_feed 160 16

kin_job "$work/a.json" "$work/a" g1
kin_job "$work/b.json" "$work/b" g1
sed -i 's/"max_seqs": 16/"max_seqs": 1/; s/"group": "g1",/"group": "g1", "max_read_ahead": 10,/' \
    "$work/a.json" "$work/b.json"
"$build/tokenmill" run "$work/a.json" >"$work/a.log" 2>&1 &
pid_a=$!; pids+=("$pid_a")
# B joins once A has read ahead and works (its first commits): A's queue holds up to 10 records
# of each partition then.
c=0
for _ in $(seq 300); do
    c=$("$build/kafka_tool" committed "$bs" g1 jobs | awk '$2 > 0 { s += $2 } END { print s + 0 }')
    [ "$c" -ge 2 ] && break; sleep 0.1
done
[ "$c" -ge 2 ] || { echo "FAIL: A committed nothing"; tail "$work/a.log"; exit 1; }
"$build/tokenmill" run "$work/b.json" >"$work/b.log" 2>&1 &
pid_b=$!; pids+=("$pid_b")
rc_a=0 rc_b=0
wait "$pid_a" || rc_a=$?
wait "$pid_b" || rc_b=$?
[ "$rc_a" = 0 ] && [ "$rc_b" = 0 ] || { echo "FAIL: exit codes $rc_a $rc_b"; tail "$work/a.log" "$work/b.log"; exit 1; }

# The released records, from both logs: "rebalance: jobs/P: N queued record(s) not started are
# released (offsets 3-7,9)".
grep -h "not started are released" "$work/a.log" "$work/b.log" >"$work/released.txt" || true
n_rel_a=$(grep -c "not started are released" "$work/a.log" || true)
[ "$n_rel_a" -gt 0 ] || { echo "FAIL: A released nothing at the revoke"; grep kafka_in "$work/a.log"; exit 1; }
kin_merge --dedupe "$work/a" "$work/b"
kin_verify "$work/merged"
node -e '
  const fs = require("fs"), [rel, a, b] = process.argv.slice(1);
  const want = new Map(); // "p:o" -> copies answered
  let logged = 0;
  for (const line of fs.readFileSync(rel, "utf8").split("\n")) {
    const m = /jobs\/(\d+): (\d+) queued record\(s\) not started are released \(offsets ([0-9,-]+)\)/.exec(line);
    if (!m) continue;
    let n = 0;
    for (const r of m[3].split(",")) {
      const [lo, hi] = r.split("-").map(Number);
      for (let o = lo; o <= (hi === undefined ? lo : hi); o++, n++) want.set(m[1] + ":" + o, 0);
    }
    if (n !== +m[2]) { console.error("FAIL: " + line + ": " + n + " offsets listed"); process.exit(1); }
    logged += n;
  }
  for (const f of [a + "/.plain", a + "/errors.jsonl", b + "/.plain", b + "/errors.jsonl"]) {
    if (!fs.existsSync(f)) continue;
    for (const row of fs.readFileSync(f, "utf8").split("\n")) {
      if (!row) continue;
      const s = JSON.parse(row).source, k = s.partition + ":" + s.offset;
      if (want.has(k)) want.set(k, want.get(k) + 1);
    }
  }
  const bad = [...want].filter(([, n]) => n !== 1);
  if (bad.length) {
    console.error("FAIL: released records not answered exactly once (partition:offset copies): " +
                  bad.slice(0, 10).map(([k, n]) => k + " " + n).join(", ") + " (" + bad.length + ")");
    process.exit(1);
  }
  const k = (d) => JSON.parse(fs.readFileSync(d + "/metrics.json", "utf8")).kafka.released;
  if (k(a) + k(b) !== logged) {
    console.error("FAIL: metrics kafka.released " + k(a) + " + " + k(b) + " != " + logged + " logged");
    process.exit(1);
  }
  console.log(logged + " released (A " + k(a) + ", B " + k(b) + "), each answered once");
' "$work/released.txt" "$work/a" "$work/b" >"$work/rel.out" ||
    { cat "$work/rel.out"; grep -h "kafka_in" "$work/a.log" | tail -20; exit 1; }
kin_offsets_ok g1 "$work/a" "$work/b" >/dev/null
n_a=$(node -e 'const r = require(process.argv[1]).records; console.log(r.ok + r.failed)' "$work/a/metrics.json")
n_b=$(node -e 'const r = require(process.argv[1]).records; console.log(r.ok + r.failed)' "$work/b/metrics.json")
echo "kafka_release: $(cat "$work/rel.out"); A answered $n_a, B $n_b, $kin_dups in both folders (answered by A past its last accepted commit: the mock refuses commits while the group rebalances); $(cat "$work/verify.log")"
echo "kafka_release: ok"
