#!/usr/bin/env bash
# bench/spec_device.sh BIN_DIR OUT_DIR [BACKEND] - speculative decoding figures (issue 25), all in
# one call: the trained demo model (models/demo-pystdlib) at W1 (max_seqs 1) and W8 (max_seqs 8),
# each job with engine.speculative off and on (ngram, k 5, lookup 2..5):
#   copy:   copy-heavy prompts (COPY_JSONL, from tools/spec_copy_prompts.py: a stdlib function,
#           then its first line again), each REPEAT times (default 4, ids suffixed), greedy,
#           max_tokens MAX_TOKENS (default 384; the model's context is 1024);
#   nocopy: jobs/data/demo.jsonl's ten code starts, REPEAT times, sampled at temperature 1.0
#           (seeds per line), so the text has few repeats to copy, max_tokens MAX_TOKENS;
# then, with bench_engine built with CUDA, the 8B shape's mechanism cost (bench_engine --verify 5
# at batch 8: a verification step of 5 drafts per sequence vs a plain decode step), with the
# decode step as a CUDA graph (as the runner runs it) and eager (--no-graphs: launch cost aside).
# Writes OUT_DIR/<job>_<w>_<on|off>/{metrics.json,completions.jsonl}, OUT_DIR/summary.txt (TPOT
# from the records: (total_ms - ttft_ms) / (tokens - 1), mean over records; greedy equality of the
# copy job on/off) and OUT_DIR/verify.txt. Needs only bash, coreutils and sed on the machine.
# BACKEND: cuda (default) or cpu (a local check of the script). SKIP_VERIFY=1: no bench_engine.
set -uo pipefail
bin=$(cd "${1:?bin dir}" && pwd)
out=${2:?out dir}
backend=${3:-cuda}
src=${SRC:-$(cd "$(dirname "$0")/.." && pwd)} # the tree with models/ and jobs/
copy=${COPY_JSONL:-$src/tests/fixtures/spec/copy.jsonl}
mkdir -p "$out"
repeat=${REPEAT:-4}
max_tokens=${MAX_TOKENS:-384}
rep_jsonl() { # IN OUT: each line REPEAT times, "id" suffixed with #r and a "seed" r
    : >"$2"
    for r in $(seq 1 "$repeat"); do
        sed -e "s/\"id\": *\"\([^\"]*\)\"/\"id\": \"\1#$r\", \"seed\": $r/" "$1" >>"$2"
    done
}
rep_jsonl "$copy" "$out/copy_in.jsonl"
rep_jsonl "$src/jobs/data/demo.jsonl" "$out/nocopy_in.jsonl"
spec='"speculative": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 5}'
run_job() { # NAME W INPUT DEFAULTS on|off
    local name=$1 w=$2 input=$3 dflt=$4 s=$5 d="$out/$1_w$2_$5"
    local sp=""
    [ "$s" = on ] && sp=", $spec"
    cat >"$out/$1_w$2_$5.json" <<JOB
{ "model": "$src/models/demo-pystdlib", "input": { "files": ["$input"] },
  "output": { "dir": "$d", "compression": "none" },
  "engine": { "backend": "$backend", "max_seqs": $w, "max_batched_tokens": 2048,
              "block_size": 16, "kv_blocks": 1024 $sp },
  "defaults": $dflt }
JOB
    rm -rf "$d"
    "$bin/tokenmill" run "$out/$1_w$2_$5.json" >"$out/$1_w$2_$5.log" 2>&1 || echo "FAILED: $name w$w $s"
}
# mean TPOT (ms) over records with >= 2 tokens, from completions.jsonl
tpot() {
    sed -n 's/.*"completion_tokens":\([0-9]*\).*"ttft_ms":\([0-9.]*\),"total_ms":\([0-9.]*\).*/\1 \2 \3/p' \
        "$1/completions.jsonl" |
        awk '$1 > 1 { s += ($3 - $2) / ($1 - 1); n++ } END { if (n) printf "%.4f", s / n; else print "nan" }'
}
canon() { # completions without timing, cached_tokens and usage.speculative, sorted
    sed -e 's/,"timing":{[^}]*}//' -e 's/,"speculative":{[^}]*}//' -e 's/,"cached_tokens":[0-9]*//' \
        "$1/completions.jsonl" | sort
}
copy_dflt="{ \"max_tokens\": $max_tokens, \"temperature\": 0 }"
nocopy_dflt="{ \"max_tokens\": $max_tokens, \"temperature\": 1.0 }"
{
    echo "backend $backend; $(date -u +%FT%TZ); spec: ngram k 5 lookup 2..5; x$repeat records, max_tokens $max_tokens"
    for w in 1 8; do
        for job in copy nocopy; do
            input=$out/copy_in.jsonl dflt=$copy_dflt
            [ $job = nocopy ] && input=$out/nocopy_in.jsonl dflt=$nocopy_dflt
            run_job $job $w "$input" "$dflt" off
            run_job $job $w "$input" "$dflt" on
            a=$(tpot "$out/${job}_w${w}_off") b=$(tpot "$out/${job}_w${w}_on")
            same=$(cmp -s <(canon "$out/${job}_w${w}_off") <(canon "$out/${job}_w${w}_on") &&
                echo identical || echo DIFFERENT)
            n_diff=$(diff <(canon "$out/${job}_w${w}_off") <(canon "$out/${job}_w${w}_on") | grep -c '^<')
            acc=$(tr -d ' \n' <"$out/${job}_w${w}_on/metrics.json" |
                sed -n 's/.*"speculative":{\([^]]*\]\),"acceptance_rate_per_pos".*/\1/p')
            steps=$(for s in off on; do tr -d ' \n' <"$out/${job}_w${w}_$s/metrics.json" | sed -n 's/.*"engine":{"steps":\([0-9]*\).*/\1/p'; echo; done | paste -sd/)
            echo "$job W$w: steps off/on $steps; TPOT off $a ms, on $b ms, speed-up $(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", a/b}')x; records on/off $same ($n_diff differ); $acc"
        done
    done
} | tee "$out/summary.txt"
if [ -x "$bin/bench_engine" ] && [ "$backend" = cuda ] && [ -z "${SKIP_VERIFY:-}" ]; then
    for g in "" --no-graphs; do
        "$bin/bench_engine" --shape llama8b --batch 8 --prompt 512 --gen 64 --reps 1 --no-ceiling \
            --verify 5 $g >"$out/verify$g.txt" 2>"$out/verify$g.log" || echo "bench_engine failed" >>"$out/verify$g.txt"
        echo "bench_engine --verify 5 ${g:-(graphs)}:"
        grep -E "^verify|^speed-up|^decode" "$out/verify$g.txt"
    done
fi
