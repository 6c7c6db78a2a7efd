#!/usr/bin/env bash
# tests/e2e/e2e_include_graph.sh BUILD SRC - src/ has no include cycle between modules (a .c and
# its .h) and keeps the layering of docs/ARCHITECTURE.md (tools/include_graph).
set -euo pipefail
src=$(cd "$2" && pwd)
command -v python3 >/dev/null || { echo "no python3"; exit 77; }
python3 "$src/tools/include_graph"
