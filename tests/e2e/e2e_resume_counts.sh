#!/usr/bin/env bash
# tests/e2e/e2e_resume_counts.sh BUILD SRC - one accounting of a resumed job (issue 36): a job of
# 8 records (2 of them rejected) is stopped after its 3rd commit (TM_FAULT_POINT after_commit:3,
# one record per commit, --max-seqs 1) and run again on a terminal (a pty). Then the last
# progress redraw, the summary, metrics.json, this_run and the Prometheus textfile must agree:
# records of the whole job (8/8, the earlier runs' labelled), this run's records and tokens
# beside them, and throughput.output_tok_s = this run's completion tokens / this run's wall time.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "e2e_resume_counts: $*" >&2; exit 1; }
cd "$work"
ln -s "$src/models" models
for i in 1 2 3 4 5 6; do printf '{"id":"r%d","prompt":"def f%d(x):\\n"}\n' $i $i; done >in.jsonl
printf '{"id":"bad1","prompt":"x","max_tokens":-1}\n{"id":"bad2","prompt":"x","top_p":7}\n' >>in.jsonl
args=(run --model models/demo-pystdlib -i in.jsonl -o out --max-tokens 16 --temperature 0
      --max-seqs 1 --threads 1 --set output.commit_every_records=1
      --prometheus-textfile prom.txt)
rc=0; TM_FAULT_POINT=after_commit:3 "$build/tokenmill" -q "${args[@]}" >/dev/null 2>&1 || rc=$?
[ $rc != 0 ] || fail "the first run was not stopped"
python3 - "$build/tokenmill" "${args[@]}" <<'PY' || fail "rerun"
import json, os, pty, re, struct, fcntl, termios, sys
tm, argv = sys.argv[1], sys.argv[1:]
pid, fd = pty.fork()
if pid == 0:
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 240, 0, 0))
    os.execv(tm, argv)
data = b""
while True:
    try:
        chunk = os.read(fd, 65536)
    except OSError:
        break
    if not chunk:
        break
    data += chunk
_, status = os.waitpid(pid, 0)
text = data.decode("utf-8", "replace")
assert os.WEXITSTATUS(status) == 0, text[-2000:]
redraws = [s[len("\x1b[K"):] for s in re.split(r"[\r\n]", text) if s.startswith("\x1b[K")]
last = redraws[-1]
m = json.load(open("out/metrics.json"))
run, rec, tok = m["this_run"], m["records"], m["tokens"]
earlier = rec["in"] - run["records"]["in"]
assert rec["in"] == 8 and rec["failed"] == 2 and run["resumed"], m
assert 0 < earlier < 8, (earlier, m)
# progress: the whole job, the earlier runs' records labelled
assert re.search(rf"\b8/8 records \(100\.0%\), 2 failed \({earlier} by earlier runs\)", last), last
# summary: both, labelled
assert f"records   8 in, 6 ok, 2 failed (all runs; this run {run['records']['in']} in, " \
       f"{run['records']['ok']} ok, {run['records']['failed']} failed)" in text, text
assert f"tokens    {tok['prompt']} prompt, {tok['completion']} completion (all runs; this run " \
       f"{run['tokens']['prompt']} prompt, {run['tokens']['completion']} completion)" in text, text
assert "(this run's tokens / this run's wall time)" in text, text
# metrics.json: throughput is this run's
want = run["tokens"]["completion"] / m["time"]["wall_s"]
assert abs(m["throughput"]["output_tok_s"] - want) <= 1e-6 * max(1, want), (m["throughput"], want)
assert run["tokens"]["completion"] < tok["completion"], m
# the textfile: the whole job's records
prom = open("prom.txt").read()
assert re.search(r'^tokenmill_records_done_total\{[^}]*\} 8$', prom, re.M), prom
print(f"e2e_resume_counts: ok ({earlier} records by the first run; last redraw {last!r})")
PY
