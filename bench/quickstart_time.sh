#!/usr/bin/env bash
# bench/quickstart_time.sh [BUILD] - wall time of tests/e2e/e2e_readme_quickstart.sh (every README
# Quickstart block pasted twice in a fresh copy of the tracked files, with BUILD's binaries: no
# compile), N runs (default 3); prints each run's seconds and the median. BUILD: build/.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build}
n=${N:-3}
ts=()
for _ in $(seq "$n"); do
    t0=$(date +%s.%N)
    bash "$top/tests/e2e/e2e_readme_quickstart.sh" "$build" "$top" >/dev/null
    t1=$(date +%s.%N)
    ts+=("$(echo "$t1 - $t0" | bc)")
done
printf '%s\n' "${ts[@]}" | sort -n | awk '{a[NR]=$1} END {for (i=1;i<=NR;i++) printf "run %.1f s\n", a[i]; printf "median %.1f s\n", a[int((NR+1)/2)]}'
