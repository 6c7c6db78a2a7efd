#!/usr/bin/env bash
# bench/ci_time.sh [PREFIX] - where `make test`'s time goes (issues 24, 32): runs its pieces
# one after the other, each timed by /usr/bin/time (wall, user, sys seconds), with build folders
# PREFIX-build, PREFIX-asan, PREFIX-fuzz (default PREFIX build-ct: fresh folders, so the builds
# are clean builds like a fresh clone's), and the per-test times of every ctest run. The pieces
# are exactly `make test`'s commands (Makefile; no retries, fuzz-ci's fixed seed and runs), which
# runs asantest, fuzzbuild + fuzz and kafka side by side; STEPS=whole times `make test` itself
# in those folders instead (the figure for "make test under 15 minutes": use a clean clone).
# Run from the source root. On a shared machine compare user+sys (CPU), not wall.
#   STEPS="fmt build asan test kafka asantest fuzzbuild fuzz" (default: all, in that order)
#   JOBS (default nproc), CMAKE_FLAGS (for the normal build, as `make build` takes them)
# Output: PREFIX-logs/times.txt (one line per piece) and PREFIX-logs/<piece>.log (build output,
# ctest --timing output); a PREFIX starting with "build" keeps them git-ignored.
set -uo pipefail
p=${1:-build-ct}
jobs=${JOBS:-$(nproc)}
steps=${STEPS:-fmt build asan test kafka asantest fuzzbuild fuzz}
mkdir -p "$p-logs"
out=$p-logs/times.txt
: >>"$out"
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD)$(git diff --quiet || echo +dirty)" \
    "nproc=$(nproc) jobs=$jobs load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
piece() { # piece NAME CMD... : time one piece, log to PREFIX-NAME.log, one line to $out
    local name=$1
    shift
    /usr/bin/time -f "%e %U %S" -o "$p-logs/$name.time" "$@" >"$p-logs/$name.log" 2>&1
    local rc=$?
    read -r w u s <"$p-logs/$name.time" || true
    printf '%-10s rc=%d wall=%7.1f s user=%7.1f s sys=%6.1f s cpu=%7.1f s load=%s\n' "$name" "$rc" \
        "$w" "$u" "$s" "$(echo "$u + $s" | bc)" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$out"
}
for s in $steps; do
    case $s in
    fmt) piece fmt make --no-print-directory format-check ;;
    build) piece build make --no-print-directory build BUILD="$p-build" JOBS="$jobs" \
        CMAKE_FLAGS="${CMAKE_FLAGS:-}" ;;
    asan) piece asan make --no-print-directory build-asan ASAN_BUILD="$p-asan" JOBS="$jobs" ;;
    test) piece test bash -c "cd $p-build && ctest --timing --output-on-failure -j $jobs -LE kafka" ;;
    kafka) piece kafka bash -c "cd $p-build && ctest --timing --output-on-failure -j $jobs -L kafka" ;;
    asantest) piece asantest bash -c "cd $p-asan && ctest --timing --output-on-failure -j $jobs -L unit" ;;
    fuzzbuild) piece fuzzbuild bash -c "cmake -S . -B $p-fuzz -DCMAKE_C_COMPILER=clang -DTM_FUZZ=ON \
        -DTM_CUDA=OFF -DTM_FUZZ_SEED=${FUZZ_SEED:-1} -DTM_FUZZ_RUNS_X=${FUZZ_RUNS_X:-1} >/dev/null && \
        cmake --build $p-fuzz -j $jobs --target fuzz_bins -- --no-print-directory" ;;
    fuzz) piece fuzz bash -c "cd $p-fuzz && ctest --timing -L fuzz -j $jobs --output-on-failure; \
        rc=\$?; grep -ah '^fuzz_ci: ' Testing/Temporary/LastTest.log | sort; exit \$rc" ;;
    whole) piece whole make --no-print-directory test BUILD="$p-build" ASAN_BUILD="$p-asan" \
        FUZZ_BUILD="$p-fuzz" JOBS="$jobs" CMAKE_FLAGS="${CMAKE_FLAGS:-}" ;;
    *) echo "ci_time: unknown step $s" >&2 ;;
    esac
done
# The slowest tests of each ctest piece (seconds, name).
for s in test kafka asantest fuzz whole; do
    [ -f "$p-logs/$s.log" ] || continue
    echo "-- $s: slowest tests (wall s)"
    grep -E 'Test +#' "$p-logs/$s.log" | sed -E 's/.*Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec.*/\2 \1/' |
        sort -rn | head -8
done
