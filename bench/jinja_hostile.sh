#!/usr/bin/env bash
# bench/jinja_hostile.sh BUILD [BASE_REV [BASE_BLOCKS]] - the hostile chat template's cost (issue
# 35): bench_jinja parses a flat template of 20,000 blocks (1 MiB) and renders a one-message chat
# record with it, then parses 100,000 nested blocks (refused at the nesting limit). With BASE_REV,
# the same bench is built against that revision's runner/text/jinja.c (linked with BUILD's
# libtm_base.a) and run on BASE_BLOCKS flat blocks (default 4000: the quadratic parser takes
# minutes at 20,000) and 2,000 nested ones, for the comparison. CPU only.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
echo "# $(date -u +%FT%TZ) $(uname -n) $(git -C "$src" rev-parse --short HEAD) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
cmake --build "$build" --target bench_jinja >/dev/null
echo "## this tree"
"$build/bench_jinja" 20000 100000 5
if [ $# -ge 2 ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    git -C "$src" show "$2:src/runner/text/jinja.c" >"$tmp/jinja.c"
    # the base's jinja.c against this tree's headers (jinja.h's API is unchanged but for additions)
    cc -std=c11 -O2 -D_GNU_SOURCE -I"$src/src" -o "$tmp/bench_jinja" "$src/bench/bench_jinja.c" \
        "$tmp/jinja.c" "$build/libtm_base.a" -lm -lpthread
    for nb in ${3:-4000} 2000 1000; do
        echo "## $2 ($(git -C "$src" rev-parse --short "$2")), $nb flat blocks"
        "$tmp/bench_jinja" "$nb" 2000 1
    done
fi
