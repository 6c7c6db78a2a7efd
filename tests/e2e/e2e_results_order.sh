#!/usr/bin/env bash
# tests/e2e/e2e_results_order.sh BUILD SRC - output.order "input" (issue 36): the results file
# (-o FILE.jsonl) lists the answers in input order, as vLLM's run-batch writes them, error lines
# (an invalid line, a duplicate custom_id) at their lines' places; completions.jsonl.lz4 stays in
# completion order; a rerun of the finished job derives the same file and does nothing else;
# "completion" (the default) keeps completion order; standard input cannot be read again.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "e2e_results_order: $*" >&2; exit 1; }
cd "$work"
ln -s "$src/models" models
python3 - >in.jsonl <<'PY'
import json
for i in range(12):
    print(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                      "body": {"model": "m", "prompt": "def f%d(x):\n" % i,
                               "max_tokens": 40 if i % 3 == 0 else 3, "temperature": 0}}))
print("not json")
print(json.dumps({"custom_id": "r3", "method": "POST", "url": "/v1/completions",
                  "body": {"model": "m", "prompt": "x"}}))
PY
run() { "$build/tokenmill" -q run --model models/demo-pystdlib -i in.jsonl --max-seqs 4 "$@"; }
run -o res.jsonl --set output.order=input >/dev/null || fail "run"
python3 - <<'PY' || fail "order: $(cut -c1-120 res.jsonl)"
import json, subprocess
res = [json.loads(l) for l in open("res.jsonl")]
got = [(r["custom_id"], (r["error"] or {}).get("code")) for r in res]
want = [(f"r{i}", None) for i in range(12)] + [(None, "invalid_json"), ("r3", "duplicate_id")]
assert got == want, got
comp = subprocess.run(["lz4", "-dc", "res.d/completions.jsonl.lz4"], capture_output=True,
                      text=True, check=True).stdout.splitlines()
ids = [json.loads(l)["custom_id"] for l in comp]
assert sorted(ids) == sorted(f"r{i}" for i in range(12)) and ids != [f"r{i}" for i in range(12)], ids
PY
cp res.jsonl first.jsonl
run -o res.jsonl --set output.order=input | grep -q 'already finished' || fail "rerun"
cmp res.jsonl first.jsonl || fail "the rerun derived another file"
run -o res2.jsonl >/dev/null
python3 -c '
import json
ids = [json.loads(l)["custom_id"] for l in open("res2.jsonl")][:12]
assert ids != ["r%d" % i for i in range(12)], ids' || fail "completion order"
rc=0; head -3 in.jsonl | "$build/tokenmill" -q run --model models/demo-pystdlib -i - \
    -o s.jsonl --set output.order=input >/dev/null 2>e || rc=$?
[ $rc = 1 ] && grep -q 'output.order "input" needs file inputs' e || fail "stdin: $rc $(cat e)"
echo "e2e_results_order: ok"
