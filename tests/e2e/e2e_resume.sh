#!/usr/bin/env bash
# tests/e2e/e2e_resume.sh BUILD SRC - resume and refusal rules, I/O errors and torn tails
# (RELIABILITY.md rows 3, 5, 18, 19). Every scenario ends with the exactly-once oracle
# (tests/oracles/verify_outputs.cjs) and lz4 -t:
#   idempotency  a finished job rerun is a no-op (files unchanged); a second process on the same
#                output folder is refused (lock); a changed spec or input is refused; --restart
#                starts over;
#   disk errors  ENOSPC / EIO injected at the n-th write, fsync or rename (base/fault_io.h), once
#                and persistently, chained over one job: each run stops with an error naming the
#                file, the manifest stays valid JSON naming only fsynced bytes, the next run goes
#                on; RLIMIT_FSIZE (a real EFBIG from the kernel) as well;
#   torn tails   the bytes after the committed length (a frame written but never committed) cut at
#                random points and followed by garbage: resume cuts them off; a data file shorter
#                than its committed length is refused with a clear message.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$src/tests/e2e/durable_lib.sh"
dur_setup 120
out="$work/out"
fail() { echo "FAIL: $*"; cat "$work/run.log"; exit 1; }
expect_fail() { # MESSAGE_REGEX ARGS...: the run must exit 1 and log the message
    local re=$1 rc=0
    shift
    dur_run "$@" || rc=$?
    [ "$rc" = 1 ] || fail "want exit 1, got $rc ($*)"
    grep -Eq "$re" "$work/run.log" || fail "want a message matching /$re/"
}
sums() { (cd "$out" && sha256sum completions.jsonl.lz4 errors.jsonl manifest.json metrics.json); }

# ---- idempotency ----
dur_run || fail "first run"
dur_verify
sums >"$work/sums1"
dur_run || fail "rerun of a finished job"
grep -q "already finished" "$work/run.log" || fail "rerun did not say it was finished"
sums | cmp -s - "$work/sums1" || fail "rerun of a finished job changed the outputs"
exec 9>>"$out/tokenmill.lock" # this shell holds the lock, as a running tokenmill would
flock -n 9 || fail "cannot take the lock for the test"
expect_fail "another tokenmill process" # a second process on the same folder
exec 9>&-
cp "$work/job.json" "$work/job.orig"
sed -i 's/"max_tokens": 2/"max_tokens": 3/' "$work/job.json"
expect_fail "holds another job's outputs: the job changed: defaults.max_tokens 2 -> 3.*--restart"
cp "$work/job.orig" "$work/job.json"
touch -d '2001-01-01' "$work/data/in.jsonl"
expect_fail "input .*in.jsonl changed"
sums | cmp -s - "$work/sums1" || fail "a refused run changed the outputs"
dur_run --restart || fail "--restart"
dur_verify
echo "e2e_resume: idempotency ok (no-op rerun, lock, changed spec and input refused, --restart)"

# ---- disk full / EIO, chained over one job, then a real EFBIG ----
rm -rf "$out"
n_err=0
for fault in write:2:ENOSPC fsync:3:EIO write:25:EIO rename:2:ENOSPC fsync:7:ENOSPC \
             write:40+:ENOSPC any:60:EIO; do
    rc=0
    TM_FAULT_IO=$fault dur_run || rc=$?
    dur_check_json
    if [ "$rc" = 1 ]; then
        n_err=$((n_err + 1))
        # the file (or, for the folder's fsync, the folder) and the system's words
        grep -Eq "(writing|fsync|renaming) $out[^ ]*( to [^ ]*)?: (No space left on device|Input/output error)" \
            "$work/run.log" || fail "$fault: no clear error naming the file"
    elif [ "$rc" != 0 ]; then
        fail "$fault: exit $rc"
    fi
done
[ "$n_err" -ge 5 ] || fail "only $n_err injected I/O errors stopped a run"
rc=0
(trap '' XFSZ; ulimit -f 2; exec "$build/tokenmill" -q run --restart "$work/job.json") \
    >"$work/run.log" 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "File too large" "$work/run.log" || fail "RLIMIT_FSIZE: exit $rc"
dur_check_json
dur_run || fail "resume after the disk errors"
dur_verify
echo "e2e_resume: disk errors ok ($n_err injected ENOSPC/EIO stops + EFBIG, then resumed)"

# ---- torn tails ----
rm -rf "$out"
rc=0
TM_FAULT_POINT=after_write_before_fsync:4 dur_run || rc=$?
[ "$rc" = 86 ] || fail "fault point not reached (exit $rc)"
committed=$(node -e 'const m = JSON.parse(require("fs").readFileSync(process.argv[1]));
                     console.log(m.outputs["completions.jsonl.lz4"].bytes)' "$out/manifest.json")
size=$(stat -c %s "$out/completions.jsonl.lz4")
[ "$size" -gt "$committed" ] || fail "no uncommitted tail ($size <= $committed)"
cp -a "$out" "$work/torn"
RANDOM=7
for cut in $committed $((committed + 1 + RANDOM % (size - committed))) $size; do
    rm -rf "$out"; cp -a "$work/torn" "$out"
    truncate -s "$cut" "$out/completions.jsonl.lz4"
    head -c $((1 + RANDOM % 300)) /dev/urandom >>"$out/completions.jsonl.lz4"
    printf '{"id":"torn' >>"$out/errors.jsonl" # a torn error line as well
    dur_run || fail "resume after a tail cut at $cut"
    dur_verify
done
rm -rf "$out"; cp -a "$work/torn" "$out"
truncate -s $((committed - 1)) "$out/completions.jsonl.lz4"
expect_fail "completions.jsonl.lz4 has [0-9]+ bytes but the manifest commits [0-9]+"
echo "e2e_resume: torn tails ok (cut at 3 points + garbage: resumed; lost committed bytes refused)"
echo "e2e_resume: ok"
