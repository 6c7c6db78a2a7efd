#!/usr/bin/env bash
# bench/fuzz_determinism.sh [N] [OUT] - does `make fuzz-ci` keep the same inputs on every run
# (issue 32)? Runs it as a fresh clone's first run would, in N (default 3) new build folders of
# different name lengths (build-fzdet-1, build-fzdet-22, build-fzdet-333, ...: the paths reach
# libFuzzer's argv), then twice more in the first folder: a later run, and a later run with the
# environment 16 bytes longer (FZDET_PAD: empty in the other runs, 16 characters here, so the
# stack starts exactly 16 bytes lower; `make test`'s sub-make variables move it too). Collects the
# 11 `fuzz_ci: ... digest D` lines of each run in OUT (default a new mktemp -d) and compares them:
# exit 0 when every run gave the same lines, 1 otherwise (the differing lines printed). One
# `make fuzz-ci` at a time (it uses JOBS, default nproc, cores); the folders are removed at the end.
# Run from the repository root.
set -uo pipefail
n=${1:-3}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
echo "fuzz_determinism: $n fresh folders, out $out"
dirs=()
runs=()
fuzz_ci() { # NAME FOLDER [ENV...]: one make fuzz-ci, its digest lines in OUT/NAME.txt
    local name=$1 dir=$2
    shift 2
    local t0
    t0=$(date +%s)
    env FZDET_PAD= "$@" make --no-print-directory fuzz-ci FUZZ_BUILD="$dir" >"$out/$name.log" 2>&1
    local rc=$?
    grep -a '^fuzz_ci: .* digest ' "$out/$name.log" | LC_ALL=C sort >"$out/$name.txt"
    echo "fuzz_determinism: $name ($dir): rc $rc, $(($(date +%s) - t0)) s," \
        "$(wc -l <"$out/$name.txt") digest lines"
    runs+=("$name")
}
for i in $(seq 1 "$n"); do
    dir=build-fzdet-$(printf "%${i}s" | tr ' ' "$((i % 10))")
    rm -rf "$dir"
    dirs+=("$dir")
    fuzz_ci "first$i" "$dir"
done
fuzz_ci later1 "${dirs[0]}"
fuzz_ci later1-pad16 "${dirs[0]}" FZDET_PAD=0123456789abcdef
bad=0
for r in "${runs[@]}"; do
    if ! diff -q "$out/first1.txt" "$out/$r.txt" >/dev/null; then
        echo "fuzz_determinism: $r differs from first1:"
        diff "$out/first1.txt" "$out/$r.txt"
        bad=1
    fi
done
[ "$(wc -l <"$out/first1.txt")" -gt 0 ] || bad=1
for dir in "${dirs[@]}"; do
    rm -rf "$dir"
done
if [ "$bad" = 0 ]; then
    echo "fuzz_determinism: all ${#runs[@]} runs gave the same $(wc -l <"$out/first1.txt") digests:"
    cat "$out/first1.txt"
fi
exit "$bad"
