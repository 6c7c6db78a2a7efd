#!/usr/bin/env bash
# tests/e2e/e2e_hostile_out.sh BUILD SRC - the output folder is tokenmill's alone (issue 24,
# RELIABILITY.md "Threat model"), with real files and processes:
#   links       a symbolic link (or a second hard link) under any name tokenmill writes in the
#               output folder - data files, lock, manifest, metrics, temporary files, and the data
#               file that a resume cuts back to its committed length - is refused with a message
#               naming it, and the file it points at is left unchanged;
#   lock        run A holds the folder (it waits on a FIFO for its input); tokenmill.lock is
#               deleted; run B on the same folder must still be refused; A then finishes cleanly;
#   foreign     a folder with no manifest but with files named like tokenmill's outputs is
#               refused (listing them, touching nothing) unless --restart; the files of a run that
#               stopped before its first commit are tokenmill's and a rerun goes on;
#   collisions  output.prometheus_textfile naming the manifest, an input, the job file or a file in
#               the model folder; output.dir equal to an input folder or matched by an input
#               pattern; an input that is an output file: job-spec errors naming both fields;
#   FIFOs       a FIFO in place of an output file is refused at once, never waited on;
#   job folder  `tokenmill run FOLDER` says it is a folder.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
pid_a=
cleanup() {
    [ -z "$pid_a" ] || kill "$pid_a" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
. "$src/tests/e2e/durable_lib.sh"
dur_setup 60
out="$work/out"
fail() {
    echo "FAIL: $*"
    cat "$work/run.log"
    exit 1
}
run() { timeout 60 "$build/tokenmill" -q run "$@" >"$work/run.log" 2>&1; } # a hang fails the test
expect_fail() { # MESSAGE_REGEX ARGS...: the run exits 1 (not killed by the timeout), says it
    local re=$1 rc=0
    shift
    run "$@" || rc=$?
    [ "$rc" = 1 ] || fail "want exit 1, got $rc (tokenmill run $*; 124 is a hang)"
    grep -Eq -- "$re" "$work/run.log" || fail "want a message matching /$re/"
}
victim="$work/victim.txt" # a file of the user's, elsewhere
echo "precious data of the user" >"$victim"
vsum=$(sha256sum <"$victim")
victim_intact() { [ "$(sha256sum <"$victim")" = "$vsum" ] || fail "$1: the link's target changed"; }

# ---- links ----
dur_run || fail "first run"
dur_verify
cp -a "$out" "$work/done"
# a fresh folder (restart) and a finished one: every name tokenmill writes
for name in completions.jsonl.lz4 completions.jsonl errors.jsonl tokenmill.lock manifest.json \
    metrics.json manifest.json.tmp metrics.json.tmp; do
    rm -rf "$out"
    mkdir -p "$out"
    : >"$out/tokenmill.lock"
    rm -f "$out/$name"
    ln -s "$victim" "$out/$name"
    expect_fail "$out/$name is a symbolic link" --restart "$work/job.json"
    victim_intact "link at $name"
done
rm -rf "$out"
mkdir -p "$out"
ln "$victim" "$out/errors.jsonl" # a second hard link: writing it would write the victim
: >"$out/tokenmill.lock"
expect_fail "$out/errors.jsonl has 2 hard links" --restart "$work/job.json"
victim_intact "hard link at errors.jsonl"
rm -f "$out/errors.jsonl"
# resume: the torn tail is cut from the real file, never from a link's target
rm -rf "$out"
rc=0
TM_FAULT_POINT=after_write_before_fsync:4 dur_run || rc=$?
[ "$rc" = 86 ] || fail "fault point not reached (exit $rc)"
committed=$(node -e 'const m = JSON.parse(require("fs").readFileSync(process.argv[1]));
                     console.log(m.outputs["completions.jsonl.lz4"].bytes)' "$out/manifest.json")
[ "$committed" -gt 0 ] || fail "nothing committed before the fault point"
cp "$out/completions.jsonl.lz4" "$work/victim2"
head -c 100 /dev/urandom >>"$work/victim2" # longer than committed: the cut would shorten it
v2sum=$(sha256sum <"$work/victim2")
rm "$out/completions.jsonl.lz4"
ln -s "$work/victim2" "$out/completions.jsonl.lz4"
expect_fail "$out/completions.jsonl.lz4 is a symbolic link" "$work/job.json"
[ "$(sha256sum <"$work/victim2")" = "$v2sum" ] || fail "resume cut the link's target"
rm "$out/completions.jsonl.lz4"
head -c "$committed" "$work/victim2" >"$out/completions.jsonl.lz4"
dur_run || fail "resume once the link is gone"
dur_verify
echo "e2e_hostile_out: links ok (8 names + a hard link refused, targets intact; resume cut)"

# ---- lock: deleting tokenmill.lock does not let a second writer in ----
rm -rf "$out"
sed 's#"files": \["data/in.jsonl"\]#"files": ["-"]#' "$work/job.json" >"$work/job_stdin.json"
mkfifo "$work/feed"
"$build/tokenmill" -q run "$work/job_stdin.json" <"$work/feed" >"$work/a.log" 2>&1 &
pid_a=$!
exec 8>"$work/feed" # A now waits for its input, holding the output folder
for _ in $(seq 600); do # until A holds the lock (flock -n fails)
    [ -f "$out/tokenmill.lock" ] && ! flock -n "$out/tokenmill.lock" true && break
    sleep 0.1
done
! flock -n "$out/tokenmill.lock" true || fail "run A never took the lock"
rm "$out/tokenmill.lock"
rc=0
timeout 60 "$build/tokenmill" -q run "$work/job_stdin.json" </dev/null >"$work/run.log" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "run B on a folder that run A holds: exit $rc (want 1)"
grep -q "another tokenmill process is running a job in $out" "$work/run.log" ||
    fail "run B: no message naming the holder"
head -n 20 "$work/data/in.jsonl" >&8
exec 8>&-
rc=0
wait "$pid_a" || rc=$?
pid_a=
[ "$rc" = 0 ] || { cat "$work/a.log"; fail "run A: exit $rc"; }
lz4 -tq "$out/completions.jsonl.lz4" || fail "run A's completions do not decode"
n_done=$(node -e 'const m = JSON.parse(require("fs").readFileSync(process.argv[1]));
                  console.log(m.records.finished ? m.counts.ok + m.counts.failed : -1)' \
    "$out/manifest.json")
[ "$n_done" = 20 ] || fail "run A: $n_done records done (want 20, finished)"
echo "e2e_hostile_out: lock ok (tokenmill.lock deleted under a running job: second run refused)"

# ---- foreign files in a folder without a manifest ----
rm -rf "$out"
mkdir -p "$out"
for f in completions.jsonl.lz4 errors.jsonl metrics.json; do echo "user's $f" >"$out/$f"; done
(cd "$out" && sha256sum completions.jsonl.lz4 errors.jsonl metrics.json) >"$work/user.sums"
expect_fail "holds completions.jsonl.lz4, errors.jsonl, metrics.json but no manifest.json" \
    "$work/job.json"
(cd "$out" && sha256sum -c --quiet "$work/user.sums") || fail "a refused run changed user files"
[ ! -e "$out/tokenmill.lock" ] || fail "a refused run left tokenmill.lock behind"
expect_fail "not written by tokenmill" "$work/job.json" # and again: the refusal sticks
run --restart "$work/job.json" || fail "--restart over user files"
dur_verify
# a run stopped before its first commit leaves tokenmill's own files: the rerun goes on
rm -rf "$out"
rc=0
TM_FAULT_IO=write:1:EIO dur_run || rc=$?
[ "$rc" = 1 ] || fail "first write failing: exit $rc"
[ -e "$out/completions.jsonl.lz4" ] && [ ! -e "$out/manifest.json" ] ||
    fail "the stopped run did not leave data files without a manifest"
dur_run || fail "rerun after a run that stopped before its first commit"
dur_verify
echo "e2e_hostile_out: foreign files ok (refused and untouched; --restart; own crash leftovers)"

# ---- collisions between outputs and inputs ----
job2() { # FILE OUTPUT_JSON INPUT_JSON: a job in $work with these sections
    cat >"$1" <<JOB
{ "model": "model", "input": $3, "output": $2,
  "engine": { "backend": "cpu", "max_seqs": 4, "block_size": 16, "threads": 1 },
  "defaults": { "max_tokens": 1, "temperature": 0 } }
JOB
}
rm -rf "$out"
cp -a "$work/done" "$out"
insum=$(sha256sum <"$work/data/in.jsonl")
msum=$(sha256sum <"$out/manifest.json")
in_files='{ "files": ["data/in.jsonl"] }'
check_collision() { # JOB_JSON_OUTPUT INPUT_JSON REGEX
    job2 "$work/c.json" "$1" "$2"
    expect_fail "$3" "$work/c.json"
    [ "$(sha256sum <"$work/data/in.jsonl")" = "$insum" ] || fail "an input was overwritten"
    [ "$(sha256sum <"$out/manifest.json")" = "$msum" ] || fail "the manifest was overwritten"
}
check_collision '{ "dir": "out", "prometheus_textfile": "out/manifest.json" }' "$in_files" \
    "output.prometheus_textfile: .*/out/manifest.json is also output.dir \(manifest.json\)"
check_collision '{ "dir": "out2", "prometheus_textfile": "data/in.jsonl" }' "$in_files" \
    "input.files\[0\]: .*in.jsonl, which is output.prometheus_textfile"
check_collision '{ "dir": "out2", "prometheus_textfile": "c.json" }' "$in_files" \
    "output.prometheus_textfile: .*/c.json is the job file itself"
check_collision '{ "dir": "out2", "prometheus_textfile": "model/metrics.prom" }' "$in_files" \
    "output.prometheus_textfile: .*is inside the model folder"
check_collision '{ "dir": "data" }' '{ "files": ["data"] }' \
    "input.files\[0\]: \"data\" reads .*/data/completions.jsonl.lz4, which is output.dir"
check_collision '{ "dir": "data/out" }' '{ "files": ["data/*"] }' \
    "input.files\[0\]: \"data/\*\" reads .*/data/out/completions.jsonl.lz4"
check_collision '{ "dir": "out" }' '{ "files": ["data/in.jsonl", "out/errors.jsonl"] }' \
    "input.files\[1\]: \"out/errors.jsonl\" reads .*/out/errors.jsonl, which is output.dir \(errors.jsonl\)"
check_collision '{ "dir": "out", "results_file": "out/errors.jsonl" }' "$in_files" \
    "output.results_file: .*/out/errors.jsonl is also output.dir \(errors.jsonl\)"
check_collision '{ "dir": "out2", "results_file": "r.jsonl", "prometheus_textfile": "r.jsonl" }' \
    "$in_files" "output.results_file: .*/r.jsonl is also output.prometheus_textfile"
ln -s ../out/errors.jsonl "$work/data/linked.jsonl" # a link to an output, named as an input
check_collision '{ "dir": "out" }' '{ "files": ["data/linked.jsonl"] }' \
    "input.files\[0\]: \"data/linked.jsonl\" reads .*/out/errors.jsonl, which is output.dir"
rm "$work/data/linked.jsonl"
ln "$out/errors.jsonl" "$work/data/hard.jsonl" # another name of an output, found by inode
check_collision '{ "dir": "out" }' '{ "files": ["data"] }' \
    "input.files: input .*hard.jsonl is .*/out/errors.jsonl \(output.dir \(errors.jsonl\)\)"
rm "$work/data/hard.jsonl"
[ ! -e "$work/out2" ] || fail "a refused job created its output folder"
echo "e2e_hostile_out: collisions ok (11 job-spec errors, nothing written)"

# ---- FIFOs in place of output files: refused at once ----
for name in errors.jsonl completions.jsonl.lz4 manifest.json metrics.json.tmp tokenmill.lock; do
    rm -rf "$out"
    cp -a "$work/done" "$out"
    rm -f "$out/$name"
    mkfifo "$out/$name"
    expect_fail "$out/$name is a FIFO, not a regular file" --restart "$work/job.json"
done
echo "e2e_hostile_out: FIFOs ok (5 names refused without blocking)"

# ---- a job path that is a folder ----
expect_fail "$work is a folder, not a job file" "$work"
echo "e2e_hostile_out: ok"
