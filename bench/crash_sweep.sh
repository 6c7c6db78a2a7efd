#!/usr/bin/env bash
# bench/crash_sweep.sh [POINTS] [SEED] - the long kill -9 sweep of RELIABILITY.md row 1 (nightly or
# manual; CI runs 24 points): tests/e2e/e2e_crash.sh with POINTS random SIGKILLs (default 200) and
# the named commit-protocol points, then the exactly-once oracle. Needs a built tree in $BUILD
# (default build). About 1 s per kill point on 2 cores.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$top/build}
TM_CRASH_POINTS=${1:-200} TM_CRASH_SEED=${2:-$(( $(date +%s) % 100000 ))} \
    bash "$top/tests/e2e/e2e_crash.sh" "$build" "$top"
