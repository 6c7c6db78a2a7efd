#!/usr/bin/env bash
# bench/fuzz_sweep.sh BUILD [SECONDS] [TARGET...] - long fuzz sweep of the libFuzzer targets
# (RELIABILITY.md #13), one process at a time on one core (no -jobs/-workers), for the nightly run.
# BUILD is a -DTM_FUZZ=ON build dir with `--target fuzz_bins` built (-DTM_FUZZ_STACK_DEPTH=ON adds
# the stack depth as a feature, off in the gate's builds: CMakeLists.txt); SECONDS (default 420) is
# the time per target: two thirds with CI's flags (-timeout=10 -rss_limit_mb=2048, max_len and dict as
# the ctest fuzz_<name> line in CMakeLists.txt), then one third with -timeout=3 on the grown corpus
# to catch inputs that would time out on a slower or loaded CI machine. Each target starts from its
# committed corpus tests/fuzz/corpus_<name> (read only) into a scratch dir; a run that stops on a
# finding is restarted for the time left (at most 3 times a phase; not when the finding was not
# new). -report_slow_units=1 saves every new slowest input over 1 s (wall time: on a loaded
# machine check them with /usr/bin/time, CPU time). Findings (crash-*, leak-*, timeout-*, oom-*,
# slow-unit-*) are kept in OUT (default: a new mktemp -d, printed) with each grown corpus
# OUT/corpus_<name>; a summary line per target goes to OUT/summary.tsv:
#   target seconds executions exec/s corpus(units) findings slowest_s(wall)
# Exit status 1 when anything but a slow unit was found.
set -uo pipefail
build=$(cd "$1" && pwd)
secs=${2:-420}
shift $(($# >= 2 ? 2 : 1))
src=$(cd "$(dirname "$0")/.." && pwd)
out=${FUZZ_SWEEP_OUT:-$(mktemp -d)}
mkdir -p "$out/artifacts"
targets=("$@")
# guided and the parsers with the largest inputs first
[ ${#targets[@]} -gt 0 ] || targets=(guided jinja tokenizer job_spec safetensors model_config
                                     record manifest lz4_input)
declare -A maxlen=([record]=65536 [jinja]=8192 [tokenizer]=8192 [guided]=4096 [safetensors]=16384
                   [model_config]=8192 [manifest]=16384 [job_spec]=8192 [lz4_input]=16384)
echo "fuzz_sweep: out $out, $secs s per target"
printf 'target\tseconds\texecutions\texec_s\tcorpus\tfindings\tslowest_s\n' >"$out/summary.tsv"
bad=0
for t in "${targets[@]}"; do
    bin="$build/fuzz_$t"
    [ -x "$bin" ] || { echo "fuzz_sweep: no $bin" >&2; exit 2; }
    work=$(mktemp -d)
    dict=()
    [ -f "$src/tests/fuzz/$t.dict" ] && dict=(-dict="$src/tests/fuzz/$t.dict")
    total_execs=0 total_s=0 slowest=0
    for phase in 10 3; do
        if [ "$phase" = 10 ]; then left=$((secs * 2 / 3)); else left=$((secs - secs * 2 / 3)); fi
        for try in 1 2 3 4; do
            [ "$left" -gt 0 ] || break
            log="$out/$t.t$phase.$try.log"
            before=$(ls "$out/artifacts")
            t0=$(date +%s)
            "$bin" "$work" "$src/tests/fuzz/corpus_$t" -max_total_time="$left" -rss_limit_mb=2048 \
                -timeout="$phase" -max_len="${maxlen[$t]}" "${dict[@]}" -report_slow_units=1 \
                -artifact_prefix="$out/artifacts/$t-" -print_final_stats=1 >"$log" 2>&1
            rc=$?
            el=$(($(date +%s) - t0))
            total_s=$((total_s + el))
            left=$((left - el))
            ex=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
            total_execs=$((total_execs + ${ex:-0}))
            sl=$(sed -n 's/^stat::slowest_unit_time_sec: *//p' "$log" | tail -1)
            [ "${sl:-0}" -gt "$slowest" ] && slowest=$sl
            echo "fuzz_sweep: $t timeout=$phase try $try: rc $rc, ${el} s, ${ex:-?} execs"
            [ "$rc" = 0 ] && break
            # the same finding again (e.g. a corpus input over the timeout): restarting won't help
            [ "$(ls "$out/artifacts")" = "$before" ] && break
            [ "$left" -gt 5 ] || break
        done
    done
    # units in the fuzzer's corpus at its last DONE line (the work dir also keeps reduced ones)
    corpus=$(grep -ah 'DONE ' "$out/$t".t*.log | tail -1 | sed -n 's/.* corp: \([0-9]*\).*/\1/p')
    found=$(cd "$out/artifacts" && ls | grep "^$t-" | grep -v "^$t-slow-unit-" | tr '\n' ' ')
    slow=$(cd "$out/artifacts" && ls | grep -c "^$t-slow-unit-")
    [ -n "$found" ] && bad=1
    rate=$((total_execs / (total_s > 0 ? total_s : 1)))
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$total_s" "$total_execs" "$rate" "$corpus" \
        "${found:-none}$([ "$slow" -gt 0 ] && echo " slow-units:$slow")" "$slowest" >>"$out/summary.tsv"
    mv "$work" "$out/corpus_$t" # the grown corpus, for minimizing or merging by hand
done
column -t -s $'\t' "$out/summary.tsv"
exit $bad
