#!/usr/bin/env bash
# bench/dsv41_cuda_job.sh [kill] [jvb] - DeepSeek-V4.1 through `tokenmill run` on the CUDA engine
# (issue 40), on a GPU machine, from binaries built on the CPU machine:
#   kill  a small random V4.1 checkpoint (mkmodel --arch deepseek_v41, the e2e test's layout:
#         Engram layers, compress ratios 0/2/2/1/1/1, candidate selection, its built-in tokenizer),
#         a job of N_KILL records (every 40th line broken) run once uninterrupted, then again
#         from scratch SIGKILLed KILLS times (each once its completions pass the next of KILLS
#         even steps through the input) and resumed to the end. Checks: every
#         valid input id answered exactly once (completions + errors), the broken lines reported,
#         the manifest finished; and how many records of the killed run equal the uninterrupted
#         run's (greedy; equal is expected of the exact mode, the fast mode may change a token
#         where a batch's composition changes a near tie).
#   jvb   job vs bench: mkmodel --arch deepseek_v41 with the layers IDS of the released
#         V4.1-Flash config (the model of bench_engine --shape dsv41-flash --layer-ids IDS, whose
#         --mkmodel-args gives mkmodel's options: width 5120, 64 heads x 512, 384 experts of 2304
#         top 6 MXFP4, FP8 [32, 32] dense, Engram at layer 1 with 4-grams, 8 heads x 256, ~3 M
#         rows a table), the DeepSeek V3 tokenizer, written to $W (default /dev/shm);
#         `tokenmill run` with backend cuda: 8 records of ~512 tokens, GEN greedy tokens, max_seqs
#         8, prefix cache off; then bench_engine --shape dsv41-flash --layer-ids IDS --batch 8
#         --prompt 512 --gen GEN at the same lengths. The issue asks the job's decode rate within
#         10% of the bench's.
# Env: B (folder with tokenmill, mkmodel, bench_engine and lib/ with lz4 and the libraries the
# device lacks), TOK (tokenizer folder, for jvb), OUT (logs), W (work folder), IDS (default 0,1,2:
# the released model's first three layers, 22 GB),
# GEN (default 128), N_KILL (default 600), KILLS (default 5), BACKEND (cuda; cpu: a dry run of the
# same steps on the CPU engine, with jvb at small widths).
set -u
B=$(cd "${B:?binaries folder}" && pwd)
OUT=${OUT:-out-device}; W=${W:-/dev/shm/dsv41job}; IDS=${IDS:-0,1,2}; GEN=${GEN:-128}
N_KILL=${N_KILL:-600}; KILLS=${KILLS:-5}; BACKEND=${BACKEND:-cuda}
mkdir -p "$OUT" "$W"
OUT=$(cd "$OUT" && pwd)
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
LZ4=$B/lib/lz4; [ -x "$LZ4" ] || LZ4=lz4
stages=${*:-kill jvb}
has() { [[ " $stages " == *" $1 "* ]]; }
threads=""; [ "$BACKEND" = cpu ] && threads=', "threads": 2'

# canon OUT_DIR: sorted (id, choices' text) lines of the completions
canon() {
  "$LZ4" -dc "$1/completions.jsonl.lz4" 2> /dev/null | python3 -c '
import json, sys
rows = []
for l in sys.stdin:
    o = json.loads(l)
    rows.append(json.dumps([o.get("id"), [c.get("text") for c in o.get("choices", [])]]))
print("\n".join(sorted(rows)))'
}

if has kill; then
  K=$W/kill
  rm -rf "$K"; mkdir -p "$K/data"
  "$B/mkmodel" --arch deepseek_v41 --out "$K/model" --seed 9 --layers 6 \
    --compress-ratios 0,2,2,1,1,1 --kv-sources 1,3 --index-sources 1,3,5 --candidate-source 3 \
    --candidate-topk-blocks 2 --candidate-block-size 2 > "$OUT/kill_mkmodel.log" 2>&1 ||
    { echo "kill: mkmodel failed"; tail -3 "$OUT/kill_mkmodel.log"; }
  python3 - "$K/data/in.jsonl" "$N_KILL" <<'PY'
import json, sys
n = int(sys.argv[2])
with open(sys.argv[1], "w") as f:
    for i in range(1, n + 1):
        if i % 40 == 0:
            f.write('{"id": %d, "prompt": oops}\n' % i)
        else:
            f.write(json.dumps({"id": "r%d" % i, "prompt": "record %d hello cafe " % i + "ab " * (i % 9),
                                "max_tokens": 1 + (i % 5)}) + "\n")
PY
  for tag in once killed; do
    cat > "$K/job_$tag.json" << JOB
{ "model": "model", "input": { "files": ["data/in.jsonl"] },
  "output": { "dir": "out_$tag", "commit_every_s": 0.05, "commit_every_records": 8 },
  "engine": { "backend": "$BACKEND", "max_seqs": 8, "max_batched_tokens": 256, "block_size": 16,
              "lookahead": 32$threads },
  "defaults": { "max_tokens": 2, "temperature": 0 } }
JOB
  done
  t0=$(date +%s%N)
  (cd "$K" && "$B/tokenmill" -q run job_once.json) > "$OUT/kill_once.log" 2>&1
  echo "kill: uninterrupted run rc=$? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  RANDOM=40
  kills=0
  t0=$(date +%s%N)
  for ((k = 0; k < KILLS; k++)); do
    (cd "$K" && exec "$B/tokenmill" -q run job_killed.json) >> "$OUT/kill_runs.log" 2>&1 &
    pid=$!
    # kill once the committed completions pass the next of KILLS even steps through the input
    # (or after 60 s), so the kills land mid-run whatever the engine's speed
    goal=$(( (k + 1) * N_KILL / (KILLS + 1) )); t_k=$(date +%s)
    while kill -0 "$pid" 2> /dev/null && (( $(date +%s) - t_k < 60 )); do
      n=$("$LZ4" -dc "$K/out_killed/completions.jsonl.lz4" 2> /dev/null | wc -l)
      (( n >= goal )) && break
      sleep 0.05
    done
    kill -9 "$pid" 2> /dev/null
    rc=0; wait "$pid" 2> /dev/null || rc=$?
    [ "$rc" = 137 ] && kills=$((kills + 1))
    n_done=$("$LZ4" -dc "$K/out_killed/completions.jsonl.lz4" 2> /dev/null | wc -l)
    echo "kill: run $k rc=$rc, completions so far $n_done"
  done
  (cd "$K" && "$B/tokenmill" -q run job_killed.json) >> "$OUT/kill_runs.log" 2>&1
  echo "kill: final resumed run rc=$? ($kills of $KILLS runs killed; all runs $(( ($(date +%s%N) - t0) / 1000000 )) ms)"
  python3 - "$K/data/in.jsonl" "$K/out_killed" "$LZ4" <<'PY'
import json, subprocess, sys
inp, out, lz4 = sys.argv[1:4]
want, broken = set(), 0
for l in open(inp):
    try:
        want.add(json.loads(l)["id"])
    except ValueError:
        broken += 1
rows = subprocess.run([lz4, "-dc", out + "/completions.jsonl.lz4"], capture_output=True,
                      check=True).stdout.decode().splitlines()
ids = [json.loads(l)["id"] for l in rows]
errs = [json.loads(l) for l in open(out + "/errors.jsonl")] if __import__("os").path.exists(out + "/errors.jsonl") else []
eids = [e.get("id") for e in errs if e.get("id") is not None]
dup = len(ids) - len(set(ids))
missing = want - set(ids) - set(eids)
both = set(ids) & set(eids)
m = json.load(open(out + "/manifest.json"))
fin = bool(m.get("records", {}).get("finished"))
print("kill: exactly-once: %d completions, %d duplicates, %d valid ids missing, %d both answered "
      "and failed, %d error lines (%d broken input lines), manifest finished %s"
      % (len(ids), dup, len(missing), len(both), len(errs), broken, fin))
ok = dup == 0 and not missing and not both and fin and len(errs) >= broken
print("kill: exactly-once " + ("OK" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
  canon "$K/out_once" > "$K/once.txt"; canon "$K/out_killed" > "$K/killed.txt"
  same=$(comm -12 "$K/once.txt" "$K/killed.txt" | wc -l)
  echo "kill: records equal to the uninterrupted run's: $same of $(wc -l < "$K/once.txt")"
  cp "$K/out_killed/manifest.json" "$OUT/kill_manifest.json" 2> /dev/null
  rm -rf "$K"
fi

if has jvb; then
  TOK=$(cd "${TOK:?tokenizer folder}" && pwd)
  J=$W/jvb
  # the released model's layers IDS, as bench_engine builds them (one place for the layout)
  read -r -a mk < <("$B/bench_engine" --shape dsv41-flash --layer-ids "$IDS" --mkmodel-args) ||
    { echo "jvb: bench_engine --mkmodel-args failed"; exit 1; }
  if [ "$BACKEND" = cpu ]; then # a dry run: the same layout at small widths (the last flag wins)
    small=(--dim 256 --heads 4 --head-dim 64 --rope-dim 16 --q-lora 64 --o-groups 2 --o-lora 64
      --ff 64 --experts 8 --topk 2 --window 16 --index-heads 4 --index-dim 32 --index-topk 16
      --engram-heads 2 --engram-dim 64
      --engram-vocab 2000)
    plen=64; GEN=8
  else
    small=()
    plen=512
  fi
  t0=$(date +%s)
  rm -rf "$J"; mkdir -p "$J"
  "$B/mkmodel" --arch deepseek_v41 --out "$J/model" --seed 3 "${mk[@]}" "${small[@]}" \
    --tokenizer "$TOK" > "$OUT/jvb_mkmodel.log" 2>&1 ||
    { echo "jvb: mkmodel failed"; tail -3 "$OUT/jvb_mkmodel.log"; exit 1; }
  echo "jvb: checkpoint (released layers $IDS) in $(( $(date +%s) - t0 )) s ($(du -sh "$J/model" | cut -f1)): $(tail -1 "$OUT/jvb_mkmodel.log")"
  python3 - "$J/in.jsonl" "$plen" <<'PY'
import json, random, sys
words = ("time data model river stone light paper music green table window garden number "
         "market system report letter winter summer engine signal planet forest bridge").split()
rng = random.Random(11)
with open(sys.argv[1], "w") as f:
    for i in range(8):
        f.write(json.dumps({"id": "d8-%d" % i,
                            "prompt": " ".join(rng.choice(words) for _ in range(int(sys.argv[2])))}) + "\n")
PY
  cat > "$J/job.json" << JOB
{ "model": "model", "input": { "files": ["in.jsonl"] }, "output": { "dir": "out" },
  "engine": { "backend": "$BACKEND", "max_seqs": 8, "max_batched_tokens": 8192, "block_size": 128,
              "kv_blocks": ${KV_BLOCKS:-0}, "prefix_cache": false$threads },
  "defaults": { "max_tokens": $GEN, "temperature": 0, "ignore_eos": true } }
JOB
  t1=$(date +%s)
  (cd "$J" && "$B/tokenmill" run job.json) > "$OUT/jvb_job.log" 2>&1
  echo "jvb: tokenmill run rc=$? in $(( $(date +%s) - t1 )) s"
  grep -E "KV pool|graph|error|E " "$OUT/jvb_job.log" | head -6
  cp "$J/out/metrics.json" "$OUT/jvb_metrics.json" 2> /dev/null
  python3 "$(dirname "$0")/job_metrics.py" "$J/out/metrics.json" "jvb job"
  if [ "$BACKEND" = cuda ]; then
    "$B/bench_engine" --shape dsv41-flash --layer-ids "$IDS" --batch 8 --prompt 512 --gen "$GEN" \
      --reps 2 2>&1 | grep -E "dsv41-flash"
  else
    echo "jvb: [dry-run, no GPU] would run: $B/bench_engine --shape dsv41-flash --layer-ids $IDS --batch 8 --prompt 512 --gen $GEN --reps 2"
  fi
  rm -rf "$J"
fi
