#!/usr/bin/env bash
# tests/e2e/e2e_v41_oracle.sh BUILD SRC - the DeepSeek-V4.1 fixtures are regenerable: rebuild the
# smallest shape of tests/oracles/make_v41_fixtures.py (after the oracle's --selftest of its number
# formats and kernels on hand-checked cases) with this build's mkmodel, run the NumPy
# oracle (tests/oracles/v41_ref.py) on it and compare with the committed
# tests/fixtures/v41/<name>.json (same ids, logits within 1e-4 of max |logit|). Skipped (77)
# without NumPy or before the fixtures exist.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
shape=v41_tiny
py=
for p in /usr/bin/python3 python3; do
    if "$p" -c 'import numpy' >/dev/null 2>&1; then py=$p; break; fi
done
[ -n "$py" ] || { echo "skipped: python3 with numpy missing (tools/setup installs python3-numpy)"; exit 77; }
"$py" "$src/tests/oracles/v41_ref.py" --selftest
[ -f "$src/tests/fixtures/v41/$shape.json" ] || { echo "skipped: no tests/fixtures/v41/$shape.json"; exit 77; }
"$py" "$src/tests/oracles/make_v41_fixtures.py" --mkmodel "$build/mkmodel" \
    --out "$src/tests/fixtures/v41" --only "$shape" --check
# the DSpark draft fixtures (forward_spec) regenerate byte for byte too
"$py" "$src/tests/oracles/make_v41_dspark_fixture.py" --mkmodel "$build/mkmodel" \
    --out "$src/tests/fixtures/v41/dspark" --check
echo "e2e_v41_oracle: ok"
