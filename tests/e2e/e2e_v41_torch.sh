#!/usr/bin/env bash
# tests/e2e/e2e_v41_torch.sh BUILD SRC - the DeepSeek-V4.1 CPU engine against DeepSeek's own torch
# reference: tests/fixtures/v41_torch/*.json were written on the GPU machine by
# tests/oracles/v41_torch_ref.py --fp32 (bench/dsv41_device.sh, stage ref32: DeepSeek's own
# inference/model.py with float32 activations, the quantization points unchanged) from the same
# mkmodel checkpoints and prompts as tests/fixtures/v41/; tests/fixtures/v41_torch/LP_TOL holds the
# max |d logprob| bound (measured there: 1.1e-6). Only configs with one index-key owner are
# committed: with two, the reference's decode reads a stale index_k (docs/deepseek_v41.md,
# "Deviation"), which tokenmill does not copy. Runs test_dsv41 with V41_FIXTURES / V41_LP_TOL.
# Skipped (77) when the fixtures are missing.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
dir=$src/tests/fixtures/v41_torch
if ! ls "$dir"/*.json >/dev/null 2>&1 || [ ! -f "$dir/LP_TOL" ]; then
    echo "skipped: no torch-reference fixtures in tests/fixtures/v41_torch yet (bench/dsv41_device.sh)"
    exit 77
fi
[ -x "$build/test_dsv41" ] || { echo "skipped: no $build/test_dsv41"; exit 77; }
TM_BUILD=$build TM_SRC=$src V41_FIXTURES=$dir V41_LP_TOL=$(cat "$dir/LP_TOL") "$build/test_dsv41"
echo "e2e_v41_torch: ok"
