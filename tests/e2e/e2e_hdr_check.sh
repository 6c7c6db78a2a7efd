#!/usr/bin/env bash
# tests/e2e/e2e_hdr_check.sh BUILD SRC - every public header compiles on its own (STYLE.md section 4):
# each src/**/*.h and kernels/*.h is included alone into an empty C file and compiled with the
# project's warning flags. Headers that need CUDA are compiled with the CUDA include path.
set -euo pipefail
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cuda_inc=""
[ -d /usr/local/cuda/include ] && cuda_inc="-I/usr/local/cuda/include"
fails=0
n=0
while IFS= read -r h; do
    rel=${h#"$src"/}
    inc=${rel#src/}
    printf '#include "%s"\n' "$inc" >"$work/t.c"
    extra=""
    grep -q 'cuda_runtime\|cublas\|nccl.h' "$h" && extra="$cuda_inc"
    if [ -n "$extra" ] || ! grep -q 'cuda_runtime\|cublas\|nccl.h' "$h"; then
        if ! cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wstrict-prototypes -fsyntax-only \
            -I"$src/src" -I"$src" $extra $(pkg-config --cflags jansson liblz4 2>/dev/null) \
            "$work/t.c" 2>"$work/err"; then
            echo "header does not compile alone: $rel"
            sed 's/^/    /' "$work/err" | head -5
            fails=$((fails + 1))
        fi
        n=$((n + 1))
    fi
done < <(find "$src/src" "$src/kernels" -name '*.h' | sort)
echo "hdr_check: $n headers, $fails failed"
[ "$fails" -eq 0 ]
