#!/usr/bin/env bash
# tests/e2e/e2e_mkmodel_rope.sh BUILD SRC - issue 24 #10: mkmodel --arch deepseek_v4 writes
# partial_rotary_factor so that it reads back as the rope dim it was given, both in tokenmill
# (mkmodel loads what it wrote) and as transformers reads it (int(head_dim * factor), checked
# here with a double multiply and truncation): head_dim 48 / rope dim 16 used to be written with 10
# digits and read as 15, and 44 / 30 is 29 even with the exact quotient.
set -euo pipefail
build=$(cd "$1" && pwd)
command -v node >/dev/null 2>&1 || { echo "skipped: node missing"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for pair in "48 16" "44 30" "96 32" "64 8" "80 50" "120 34"; do
    set -- $pair
    "$build/mkmodel" --out "$work/m$1_$2" --arch deepseek_v4 --layers 1 --dsv4-layers s \
        --dsv4-mlp m --hidden 64 --heads 2 --head-dim "$1" --rope-dim "$2" --index-dim 128 \
        --vocab 512 --ctx 64 >"$work/out" 2>&1 || { echo "FAIL head_dim $1 rope $2:"; cat "$work/out"; exit 1; }
    node -e '
      const [file, h, r] = process.argv.slice(1);
      const c = JSON.parse(require("fs").readFileSync(file, "utf8"));
      const f = c.partial_rotary_factor, got = Math.trunc(+h * f);
      if (got !== +r || Math.abs(f - r / h) > 1e-15) {
        console.log(`FAIL head_dim ${h} rope ${r}: partial_rotary_factor ${f} reads as ${got}`);
        process.exit(1);
      }
      console.log(`ok head_dim ${h} rope ${r}: partial_rotary_factor ${f}`);' \
        "$work/m$1_$2/config.json" "$1" "$2"
done
echo "e2e_mkmodel_rope: ok"
