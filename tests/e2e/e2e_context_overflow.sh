#!/usr/bin/env bash
# tests/e2e/e2e_context_overflow.sh BUILD SRC - a record whose own max_tokens cannot fit beside
# its prompt in the context (issue 36): an OpenAI line gets the 400 response OpenAI and vLLM give
# ("This model's maximum context length is N tokens. However, you requested M tokens ..."), a
# native record the same message as a context_length_exceeded error record, in run and validate
# alike; a record that fits runs; the job's default max_tokens over the context is a bound, clipped
# at the context's end, with one warning per job.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "e2e_context_overflow: $*" >&2; exit 1; }
cd "$work"
ln -s "$src/models" models
tm="$build/tokenmill"
cat >oai.jsonl <<'END'
{"custom_id": "big", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "def f(x):\n", "max_tokens": 1020}}
{"custom_id": "fits", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "def f(x):\n", "max_tokens": 1019}}
END
"$tm" -q run --model models/demo-pystdlib -i oai.jsonl -o res.jsonl --max-model-len 1024 >/dev/null
python3 - <<'PY' || fail "OpenAI lines: $(cut -c1-600 res.jsonl)"
import json
by = {l["custom_id"]: l for l in map(json.loads, open("res.jsonl"))}
b = by["big"]
assert b["error"] is None and b["response"]["status_code"] == 400, b
e = b["response"]["body"]["error"]
assert e["type"] == "invalid_request_error" and e["code"] == "context_length_exceeded", e
assert e["message"] == ("This model's maximum context length is 1024 tokens. However, you "
                        "requested 1025 tokens (5 in the prompt, 1020 in the completion). Please "
                        "reduce the length of the prompt or completion."), e
assert by["fits"]["response"]["status_code"] == 200, by["fits"]
PY
printf '{"id":"n1","prompt":"def f(x):\\n","max_tokens":1020}\n{"id":"n2","prompt":"def f(x):\\n"}\n' >native.jsonl
"$tm" -q run --model models/demo-pystdlib -i native.jsonl -o out --max-tokens 5000 >/dev/null 2>warn.txt
grep -q '"id":"n1".*"code":"context_length_exceeded".*maximum context length is 1024 tokens' \
    out/errors.jsonl || fail "native: $(cat out/errors.jsonl)"
[ "$(lz4 -dc out/completions.jsonl.lz4 | grep -c '"id":"n2"')" = 1 ] || fail "n2 did not run"
[ "$(grep -c 'defaults.max_tokens 5000 is not below the context length 1024' warn.txt)" = 1 ] ||
    fail "the job's warning: $(cat warn.txt)"
"$tm" validate --model models/demo-pystdlib -i native.jsonl -o v >val.out 2>/dev/null || true
grep -v ' is valid: ' val.out | cmp - out/errors.jsonl || fail "validate differs: $(cat val.out)"
echo "e2e_context_overflow: ok"
