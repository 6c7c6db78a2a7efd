#!/usr/bin/env bash
# tests/fuzz/fuzz_ci.sh BIN CORPUS WORK SEED RUNS [--shift-check] [LIBFUZZER FLAGS...] - one
# libFuzzer target as the landing gate runs it (ctest fuzz_<name>, label fuzz; CMakeLists.txt):
# deterministic, so two runs of one commit execute the same inputs and a result depends on the code
# alone. WORK is emptied first (the committed CORPUS is only read), then libFuzzer replays every
# CORPUS input (its seeds and past findings) and runs RUNS inputs in all from -seed=SEED, no time
# limit (-runs, not -max_total_time; the corpus is replayed whatever RUNS is: RUNS 0 is the replay
# alone). A fixed seed alone is not enough: the compares libFuzzer traces for its mutations
# (-use_cmp) hold pointer values and the harnesses' temporary names (mkdtemp), which change from
# run to run, so the gate runs with -use_cmp=0 (the dictionaries stay; the sweep keeps -use_cmp),
# without address randomisation (setarch -R) and with -reload=0 (no timed re-reading of WORK).
# Even without randomisation the stack starts lower the longer argv and the environment are (a
# fresh clone's path, `make test`'s sub-make variables), so no feature may depend on a stack
# address: the binaries are built without stack-depth coverage (CMakeLists.txt,
# TM_FUZZ_STACK_DEPTH). --shift-check keeps it so: the target runs a second time (kept in
# WORK.shift) with the same argv and the environment 16 bytes longer (TM_FUZZ_CI_PAD: the stack
# starts 16 bytes lower, which flipped three targets' kept inputs with stack-depth coverage on),
# and the test fails when the two digests differ.
# For the log (with --shift-check a line "fuzz_ci: <name>: the same digest ..." follows):
#   fuzz_ci: <name> seed S runs R: corpus N inputs replayed, E executed, K kept, digest D
# where D is a hash of the names of the inputs libFuzzer kept (each the SHA-1 of its content):
# equal digests, the same exploration. Exploring with random seeds for hours is
# bench/fuzz_sweep.sh's job; `make fuzz-merge` folds its findings into the corpora.
set -uo pipefail
bin=$1 corpus=$2 work=$3 seed=$4 runs=$5
shift 5
shift_check=0
if [ "${1:-}" = --shift-check ]; then
    shift_check=1
    shift
fi
name=$(basename "$bin")
n_corpus=$(find "$corpus" -maxdepth 1 -type f | wc -l)
norand=(setarch "$(uname -m)" -R)
"${norand[@]}" true 2>/dev/null || {
    echo "fuzz_ci: setarch -R refused here: addresses are random, the inputs may vary" >&2
    norand=()
}

# run DIR PAD: the target into an emptied DIR (log DIR.log), TM_FUZZ_CI_PAD=PAD in its
# environment; sets executed, kept and digest
run() {
    local dir=$1 log=$1.log pad=$2
    shift 2
    rm -rf "$dir"
    mkdir -p "$dir"
    TM_FUZZ_CI_PAD=$pad "${norand[@]}" "$bin" "$dir" "$corpus" -seed="$seed" -runs="$runs" \
        -reload=0 -use_cmp=0 -print_final_stats=1 "$@" >"$log" 2>&1
    local rc=$?
    if [ "$rc" != 0 ]; then
        tail -60 "$log"
        echo "fuzz_ci: $name seed $seed runs $runs: FAILED (rc $rc); whole log $log; reproduce:" \
            "$bin $* <input>" >&2
        exit 1
    fi
    executed=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    kept=$(find "$dir" -maxdepth 1 -type f | wc -l)
    digest=$(find "$dir" -maxdepth 1 -type f -printf '%f\n' | LC_ALL=C sort | sha1sum | cut -c1-12)
}
run "$work" "" "$@"
grep -a -m1 '^INFO: Seed:' "$work.log"
echo "fuzz_ci: $name seed $seed runs $runs: corpus $n_corpus inputs replayed, ${executed:-?}" \
    "executed, $kept kept, digest $digest"
if [ "$shift_check" = 1 ] && [ ${#norand[@]} -gt 0 ]; then
    # the same argv (WORK too: its path is in it), only the environment 16 bytes longer
    first=$digest
    rm -rf "$work.first" "$work.shift"
    mv "$work" "$work.first"
    mv "$work.log" "$work.first.log"
    run "$work" "0123456789abcdef" "$@"
    mv "$work" "$work.shift"
    mv "$work.log" "$work.shift.log"
    mv "$work.first" "$work"
    mv "$work.first.log" "$work.log"
    if [ "$digest" != "$first" ]; then
        echo "fuzz_ci: $name: digest $digest with the stack 16 bytes lower ($work.shift), not" \
            "$first: the inputs kept depend on a stack address (stack-depth coverage, or code" \
            "that branches on an address), so the gate's inputs depend on the environment" >&2
        exit 1
    fi
    echo "fuzz_ci: $name: the same digest with the stack 16 bytes lower"
fi
