#!/usr/bin/env bash
# tests/e2e/e2e_hostile_model.sh BUILD SRC - model files and inputs that change or are not files
# (issue 35, RELIABILITY.md "Threat model"), with real processes:
#   changed   a job that reads its records from a pipe has run some of them when its weights file
#             is truncated, rewritten in place with zeros of the same size, or replaced by rename:
#             the job stops with exit 1 and an error naming model.safetensors (never SIGBUS, exit
#             135; never goes on with other weights).
#   FIFOs     a FIFO with no writer as config.json, tokenizer.json, tokenizer_config.json,
#             model.safetensors, the job file or an input file, and a device as an input, are
#             refused at once by name (exit 1 within the timeout; before, open() blocked forever
#             and the first SIGTERM was ignored).
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
    cat "$work/run.log" 2>/dev/null || true
    exit 1
}
sed 's#"files": \["data/in.jsonl"\]#"files": ["-"]#' "$work/job.json" >"$work/job_stdin.json"
cp -a "$work/model" "$work/model.orig"
weights="$work/model/model.safetensors"
[ -f "$weights" ] || fail "mkmodel wrote no model.safetensors"

# ---- changed: the weights file changes under a running job ----
for how in truncate zeros rename; do
    rm -rf "$out" "$work/model" "$work/feed"
    cp -a "$work/model.orig" "$work/model"
    mkfifo "$work/feed"
    "$build/tokenmill" -q run "$work/job_stdin.json" <"$work/feed" >"$work/run.log" 2>&1 &
    pid_a=$!
    exec 8>"$work/feed"
    head -n 5 "$work/data/in.jsonl" >&8
    for _ in $(seq 600); do # until a commit shows the first records done: the model is loaded
        [ -f "$out/manifest.json" ] && node -e '
          const m = JSON.parse(require("fs").readFileSync(process.argv[1]));
          process.exit(m.counts.ok + m.counts.failed >= 4 ? 0 : 1)' "$out/manifest.json" \
            2>/dev/null && break
        sleep 0.1
    done
    case $how in
    truncate) truncate -s 100 "$weights" ;;
    zeros) # same size, zeros, written in place (the issue: the job went on with zeroed weights)
        size=$(stat -c %s "$weights")
        head -c "$size" /dev/zero >"$work/zeros"
        cat "$work/zeros" >"$weights" ;;
    rename)
        cp "$weights" "$work/new.safetensors"
        mv "$work/new.safetensors" "$weights" ;;
    esac
    sed -n 6,30p "$work/data/in.jsonl" >&8
    exec 8>&-
    rc=0
    wait "$pid_a" || rc=$?
    pid_a=
    [ "$rc" = 1 ] || fail "$how: exit $rc (want 1; 135 is SIGBUS)"
    grep -Eq "model/model.safetensors: (the file lost bytes|changed while the job ran|replaced by another file)" \
        "$work/run.log" || fail "$how: no error naming the weights file"
done
echo "e2e_hostile_model: changed ok (truncated, zeroed in place, replaced: exit 1 naming the file)"

# ---- FIFOs and devices in place of the files a job reads ----
rm -rf "$out" "$work/model"
cp -a "$work/model.orig" "$work/model"
expect_refused() { # WHAT PATH_IN_MESSAGE ARGS...: exit 1 at once, naming the path
    local what=$1 p=$2 rc=0
    shift 2
    timeout 30 "$build/tokenmill" -q run "$@" >"$work/run.log" 2>&1 || rc=$?
    [ "$rc" = 1 ] || fail "$what: exit $rc (want 1; 124 is a hang)"
    grep -Fq "$p is a" "$work/run.log" || fail "$what: no message naming $p"
    grep -Eq "is (a FIFO|a device or other special file), not a regular file" "$work/run.log" ||
        fail "$what: no message saying what it is"
}
for name in config.json tokenizer.json tokenizer_config.json model.safetensors; do
    [ -e "$work/model/$name" ] || continue
    mv "$work/model/$name" "$work/saved"
    mkfifo "$work/model/$name"
    expect_refused "$name as a FIFO" "model/$name" --restart "$work/job.json"
    rm "$work/model/$name"
    mv "$work/saved" "$work/model/$name"
done
mkfifo "$work/job_fifo.json"
expect_refused "job file as a FIFO" "job_fifo.json" "$work/job_fifo.json"
rm "$work/job_fifo.json"
mkfifo "$work/data/fifo.jsonl"
sed 's#"files": \["data/in.jsonl"\]#"files": ["data/fifo.jsonl"]#' "$work/job.json" >"$work/job_fifo_in.json"
expect_refused "input as a FIFO" "data/fifo.jsonl" --restart "$work/job_fifo_in.json"
expect_refused "input as a device" "/dev/zero" --restart --model "$work/model" -i /dev/zero -o "$work/out_dev"
echo "e2e_hostile_model: FIFOs ok (model files, job file, input refused at once by name)"
