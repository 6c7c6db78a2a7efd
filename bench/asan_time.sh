#!/usr/bin/env bash
# bench/asan_time.sh [ASAN_BUILD] - how long the sanitized build's tests take (issue 24, CI time):
# test_runner at full size (TM_TEST_SMALL=0, what it ran before the small size existed) and at
# the sanitized build's size (TM_TEST_SMALL=1, what ctest runs there), one after the other, then
# the whole `ctest -L unit` of that build (what `make test` runs under ASan) with per-test times.
# Run from the source root after `make build-asan` (default folder build-asan). Prints wall and
# CPU seconds; on a shared machine compare the CPU figures.
set -euo pipefail
b=$(cd "${1:-build-asan}" && pwd)
export TM_SRC=$PWD TM_BUILD=$b
TIMEFORMAT='%R s wall, %U s user CPU'
for small in 0 1; do
    echo -n "test_runner TM_TEST_SMALL=$small: "
    { time env TM_TEST_SMALL=$small "$b/test_runner" >/dev/null 2>"$b/asan_time_runner_$small.log"; } 2>&1
    tail -n 1 "$b/asan_time_runner_$small.log"
done
echo -n "ctest -L unit -j $(nproc): "
{ time (cd "$b" && ctest -L unit -j "$(nproc)" --timing >"$b/asan_time_ctest.log" 2>&1 || true); } 2>&1
grep -E 'tests passed|Total Test time' "$b/asan_time_ctest.log"
grep -E 'Test +#' "$b/asan_time_ctest.log" | awk '{print $(NF-1), $4, $(NF-2)}' | sort -rn | head -8
