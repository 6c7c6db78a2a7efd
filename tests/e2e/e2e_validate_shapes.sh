#!/usr/bin/env bash
# tests/e2e/e2e_validate_shapes.sh BUILD SRC - validate answers as run would (issue 36): the lines
# it lists for an OpenAI batch file are run's errors.jsonl lines byte for byte (the Batch API's
# shape, run's ids; native records in theirs); every url tokenmill does not serve is
# "unsupported" alike (/bad_url, /rerank, /v1/rerank, /v1/embeddings); unknown-key warnings name
# only the lines that are not rejected anyway.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "e2e_validate_shapes: $*" >&2; exit 1; }
cd "$work"
ln -s "$src/models" models
cat >in.jsonl <<'END'
{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "x", "max_tokens": -2, "temprature": 1}}
{"custom_id": "b", "method": "POST", "url": "/bad_url", "body": {"model": "m", "prompt": "x", "topp": 1}}
{"custom_id": "c", "method": "POST", "url": "/rerank", "body": {"model": "m"}}
{"custom_id": "d", "method": "POST", "url": "/v1/rerank", "body": {"model": "m"}}
{"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": "x"}}
{"custom_id": "f", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "def f():\n", "max_tokens": 2, "stop_seq": 1}}
{"id": "n1", "prompt": "x", "max_tokens": -1, "foo": 1}
END
m=(--model models/demo-pystdlib -i in.jsonl)
"$build/tokenmill" validate "${m[@]}" -o v >val.out 2>val.err || fail "validate: $(cat val.err)"
"$build/tokenmill" -q run "${m[@]}" -o r >/dev/null 2>run.err || fail "run: $(cat run.err)"
grep -v ' is valid: ' val.out >val.lines
cmp val.lines r/errors.jsonl || fail "validate's lines differ from run's: $(diff val.lines r/errors.jsonl)"
python3 - <<'PY' || fail "error lines: $(cat val.lines)"
import json
lines = [json.loads(l) for l in open("val.lines")]
by = {l.get("custom_id", l.get("id")): l for l in lines}
for k in "bcde":
    assert by[k]["error"]["code"] == "unsupported", by[k]
    assert by[k]["id"].startswith("batch_req_") and by[k]["response"] is None, by[k]
assert by["a"]["error"]["code"] == "invalid_value"
assert by["n1"]["error"]["code"] == "invalid_value" and "custom_id" not in by["n1"]
assert "f" not in by
PY
for f in val.err run.err; do
    grep -q "unknown key 'body.stop_seq'" $f || fail "$f: no warning for the line that runs"
    ! grep -q "temprature\|topp\|'foo'" $f || fail "$f: warnings for rejected lines: $(cat $f)"
done
echo "e2e_validate_shapes: ok"
