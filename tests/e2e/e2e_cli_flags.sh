#!/usr/bin/env bash
# tests/e2e/e2e_cli_flags.sh BUILD SRC - the one-command options a newcomer (or a vLLM user) types:
# an unknown option gets a did-you-mean; vLLM's flag names build the same job as tokenmill's
# (--print-job compared); an error is named once ("(command-line job): " not doubled); a rerun of
# a changed one-command job says what changed and prints the command that starts over, which,
# pasted as printed, runs.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tm="$build/tokenmill"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "e2e_cli_flags: $*" >&2; exit 1; }
cd "$work"
ln -s "$src/models" models
printf '{"id": "a", "prompt": "def f(x):\\n"}\n' >in.jsonl
m=(--model models/demo-pystdlib)

# did you mean
for bad in --temprature:--temperature --max-token:--max-tokens --max-tokens=5:--max-tokens \
           --outptu:--output; do
    rc=0; "$tm" run "${m[@]}" -i in.jsonl -o out "${bad%%:*}" 1 >o 2>e || rc=$?
    [ $rc = 2 ] || fail "${bad%%:*}: exit $rc"
    grep -q "unknown option ${bad%%:*} (did you mean ${bad#*:}?)" e || fail "${bad%%:*}: $(cat e)"
    [ "$(wc -l <e)" -le 3 ] || fail "${bad%%:*}: usage dumped: $(cat e)"
done

# vLLM's names: the same job as tokenmill's own
"$tm" run "${m[@]}" -i in.jsonl -o out.jsonl --max-seqs 4 --max-batched-tokens 64 --tp 1 \
    --gpu-memory-utilization 0.5 --kv-cache-dtype fp8 --quantization none --prefix-cache true \
    --seed 3 --max-model-len 512 --print-job >own.json
"$tm" run "${m[@]}" --input-file in.jsonl --output-file out.jsonl --max-num-seqs 4 \
    --max-num-batched-tokens 64 --tensor-parallel-size 1 --gpu-memory-utilization 0.5 \
    --kv-cache-dtype fp8 --quantization none --enable-prefix-caching --seed 3 \
    --max-model-len 512 --print-job >vllm.json
cmp own.json vllm.json || fail "vLLM names build another job: $(diff own.json vllm.json)"
grep -q '"max_model_len": 512' own.json || fail "--max-model-len: $(cat own.json)"
"$tm" run "${m[@]}" -i in.jsonl -o o2 --no-enable-prefix-caching --print-job |
    grep -q '"prefix_cache": false' || fail "--no-enable-prefix-caching"

# --max-model-len caps the context: prompt + completion tokens end at it; over the model's fails
printf '{"id": "b", "prompt": "def f(x):\\n"}\n' >long.jsonl
"$tm" -q run "${m[@]}" -i long.jsonl -o ml --max-model-len 20 --max-tokens 100 >/dev/null 2>&1
lz4 -dc ml/completions.jsonl.lz4 | python3 -c '
import json, sys
u = json.loads(sys.stdin.read())["usage"]
assert u["prompt_tokens"] + u["completion_tokens"] == 20, u' || fail "--max-model-len 20"
rc=0; "$tm" -q run "${m[@]}" -i long.jsonl -o ml2 --max-model-len 99999 2>e || rc=$?
[ $rc = 1 ] && grep -q "max_model_len 99999 is over the model's context length" e ||
    fail "--max-model-len over the model's: $rc $(cat e)"

# one name per message
rc=0; "$tm" run "${m[@]}" -i in.jsonl -o out --temperature hot 2>e || rc=$?
[ $rc = 1 ] || fail "--temperature hot: exit $rc"
grep -q '(command-line job): defaults.temperature' e || fail "message: $(cat e)"
grep -q '(command-line job): (command-line job)' e && fail "doubled prefix: $(cat e)"

# a changed rerun: what changed, and a command that runs as printed
"$tm" -q run "${m[@]}" -i in.jsonl -o 'my out' --max-tokens 4 >/dev/null
rc=0; "$tm" run "${m[@]}" -i in.jsonl -o 'my out' --max-tokens 5 2>e || rc=$?
[ $rc = 1 ] || fail "changed rerun: exit $rc"
grep -q 'the job changed: defaults.max_tokens 4 -> 5' e || fail "what changed: $(cat e)"
cmd=$(sed -n 's/.*Run `\([^`]*\)`.*/\1/p' e)
[ "$cmd" = "$tm run --model models/demo-pystdlib -i in.jsonl -o 'my out' --max-tokens 5 --restart" ] ||
    fail "restart command: $cmd"
eval "$cmd" >/dev/null 2>&1 || fail "the printed command failed: $cmd"
[ "$(lz4 -dc 'my out/completions.jsonl.lz4' | grep -c '"completion_tokens":5')" = 1 ] ||
    fail "rerun with --restart"
# the lock file is gone after a clean exit (the manifest marks the folder as tokenmill's)
[ ! -e 'my out/tokenmill.lock' ] || fail "tokenmill.lock left after a clean exit"
"$tm" -q run "${m[@]}" -i in.jsonl -o 'my out' --max-tokens 5 >/dev/null || fail "rerun of a finished job"

# help texts print what they mean (no printf escapes such as a literal %%)
for c in run validate tokenize bench report; do
    "$tm" $c --help >h 2>&1 || fail "$c --help"
    grep -q '%%' h && fail "$c --help prints %%: $(grep '%%' h)"
done
# --backend cuda without a GPU (or without CUDA in the build): said plainly, with what to do
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" = 0 ]; then
    rc=0; "$tm" run "${m[@]}" -i in.jsonl -o cu --backend cuda 2>e || rc=$?
    [ $rc = 1 ] && grep -q -- '--backend cuda (engine.backend "cuda") needs a GPU: ' e ||
        fail "--backend cuda: $rc $(cat e)"
fi
echo "e2e_cli_flags: ok"
