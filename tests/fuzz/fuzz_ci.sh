#!/usr/bin/env bash
# tests/fuzz/fuzz_ci.sh BIN CORPUS WORK SEED RUNS [LIBFUZZER FLAGS...] - one libFuzzer target as
# the landing gate runs it (ctest fuzz_<name>, label fuzz; CMakeLists.txt): deterministic, so two
# runs of one commit execute the same inputs and a result depends on the code alone. WORK is
# emptied first (the committed CORPUS is only read), then libFuzzer replays every CORPUS input
# (its seeds and past findings) and runs RUNS inputs in all from -seed=SEED, no time limit
# (-runs, not -max_total_time; the corpus is replayed whatever RUNS is: RUNS 0 is the replay
# alone). A fixed seed alone is not enough: the compares libFuzzer traces for its mutations
# (-use_cmp) hold pointer values and the harnesses' temporary names (mkdtemp), which change from
# run to run, so the gate runs with -use_cmp=0 (the dictionaries stay; the sweep keeps -use_cmp),
# without address randomisation (setarch -R) and with -reload=0 (no timed re-reading of WORK).
# Last line, for the log:
#   fuzz_ci: <name> seed S runs R: corpus N inputs replayed, E executed, K kept, digest D
# where D is a hash of the names of the inputs libFuzzer kept (each the SHA-1 of its content):
# equal digests, the same exploration. Exploring with random seeds for hours is
# bench/fuzz_sweep.sh's job; `make fuzz-merge` folds its findings into the corpora.
set -uo pipefail
bin=$1 corpus=$2 work=$3 seed=$4 runs=$5
shift 5
name=$(basename "$bin")
n_corpus=$(find "$corpus" -maxdepth 1 -type f | wc -l)
rm -rf "$work"
mkdir -p "$work"
log=$work.log
norand=(setarch "$(uname -m)" -R)
"${norand[@]}" true 2>/dev/null || {
    echo "fuzz_ci: setarch -R refused here: addresses are random, the inputs may vary" >&2
    norand=()
}
"${norand[@]}" "$bin" "$work" "$corpus" -seed="$seed" -runs="$runs" -reload=0 -use_cmp=0 \
    -print_final_stats=1 "$@" >"$log" 2>&1
rc=$?
if [ "$rc" != 0 ]; then
    tail -60 "$log"
    echo "fuzz_ci: $name seed $seed runs $runs: FAILED (rc $rc); whole log $log; reproduce:" \
        "$bin $* <input>" >&2
    exit 1
fi
executed=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
kept=$(find "$work" -maxdepth 1 -type f | wc -l)
digest=$(find "$work" -maxdepth 1 -type f -printf '%f\n' | LC_ALL=C sort | sha1sum | cut -c1-12)
grep -a -m1 '^INFO: Seed:' "$log"
echo "fuzz_ci: $name seed $seed runs $runs: corpus $n_corpus inputs replayed, ${executed:-?}" \
    "executed, $kept kept, digest $digest"
