#!/usr/bin/env python3
"""tests/oracles/make_v41_fixtures.py - NumPy-oracle fixtures for the DeepSeek-V4.1 CPU engine test.

For each shape below: build a random-weight checkpoint with tokenmill's mkmodel
(--arch deepseek_v41), load it with the NumPy transliteration of DeepSeek's reference
(tests/oracles/v41_ref.py), prefill a fixed seeded prompt from start_pos 0 in one forward, record
the logits at a few prompt positions, greedy-decode N_STEPS tokens one forward per token, and write
tests/fixtures/v41/<name>.json in the shape of tests/fixtures/hf_dsv4/*.json:

    {name, mkmodel_args, prompt_ids, row_pos, rows: [[n_vocab floats]] (logits at prompt positions
     row_pos), greedy_ids, steps: [[n_vocab floats] * n_steps], step_margins, selfcheck, stats,
     config, oracle, numpy_version}

steps[0] is the prompt's last position; steps[i] (i >= 1) the logits after greedy_ids[i-1] was
appended; greedy_ids[i] = argmax(steps[i]) (lowest id on ties); step_margins[i] = steps[i]'s top-1
minus top-2 logit. Floats keep 8 significant digits. selfcheck holds the oracle's own consistency:
the same logits from prefill chunks of other sizes (chunk_<n>_max_abs_diff) and from one forward
over prompt + greedy ids (decode_vs_prefill_max_abs_diff) - both 0 up to float32 rounding.
stats counts top-k boundary ties (which the reference's torch.topk may break otherwise); the shapes
below are chosen with all of them 0. The C test rebuilds each model with
`$TM_BUILD/mkmodel --out DIR <mkmodel_args>` and compares (log-softmax of both, see
tests/oracles/README.md).

Usage (repository root, after building mkmodel):
  python3 tests/oracles/make_v41_fixtures.py [--mkmodel build/mkmodel] [--out tests/fixtures/v41]
      [--only NAME..] [--check]
--check regenerates into a temporary folder and compares with the committed fixtures (CI).
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v41_ref  # noqa: E402

# (name, prompt length, decode steps, extra prefill chunk sizes for the self-check, mkmodel args)
A = ["--arch", "deepseek_v41"]
SHAPES = [
    # The CI shape (tests/e2e/e2e_v41_oracle.sh): SWA + ratio 2 + ratio 1 sources, one Engram layer,
    # window 8 < prompt 40.
    ("v41_tiny", 40, 6, [1, 7],
     A + ["--seed", "41", "--layers", "3", "--compress-ratios", "0,2,1", "--kv-sources", "1,2",
          "--index-sources", "1,2", "--engram-layers", "0", "--index-heads", "16",
          "--index-topk", "4", "--window", "8"]),
    # Ratios 0/2/1 with consumers (layers 2 and 4 read the sources 1 and 3), Engram on 0 and 2
    # (3-grams, 2 heads), window 16 < prompt 300, top-8 of up to 150 ratio-2 entries, no candidates.
    ("v41_engram_r012", 300, 12, [1, 37],
     A + ["--seed", "42", "--layers", "5", "--compress-ratios", "0,2,2,1,1", "--kv-sources", "1,3",
          "--index-sources", "1,3", "--engram-layers", "0,2", "--index-heads", "16",
          "--index-topk", "8", "--window", "16"]),
    # Candidate selection on ratio 1: source layer 2 keeps 4 blocks of 8 (the newest, partial one
    # pinned), index source 4 (not a kv source) picks its top 16 inside them, layer 3 reuses layer
    # 2's picks; ratio 2 source at 1; 4-gram Engram with 3 heads on layer 3; 3 HC streams,
    # window 32 < prompt 260.
    ("v41_cand_r1", 260, 12, [1, 29],
     A + ["--seed", "43", "--layers", "6", "--compress-ratios", "0,2,1,1,1,0", "--kv-sources", "1,2",
          "--index-sources", "1,2,4", "--candidate-source", "2", "--candidate-topk-blocks", "4",
          "--candidate-block-size", "8", "--index-heads", "16", "--index-topk", "16",
          "--engram-layers", "3", "--engram-ngram", "4", "--engram-heads", "3", "--hc", "3",
          "--window", "32"]),
    # Candidate selection on ratio 2: kv sources 0 (ratio 1) and 1 (ratio 2, candidate source: 3
    # blocks of 4), layer 2 reuses its picks, index-only source 3 selects inside the candidates;
    # Engram on 1 and 3; 2 HC streams; no SwiGLU clamp; window 16 < prompt 200.
    ("v41_cand_r2", 200, 12, [1, 23],
     A + ["--seed", "46", "--layers", "4", "--compress-ratios", "1,2,2,2", "--kv-sources", "0,1",
          "--index-sources", "0,1,3", "--candidate-source", "1", "--candidate-topk-blocks", "3",
          "--candidate-block-size", "4", "--index-heads", "16", "--index-topk", "8",
          "--engram-layers", "1,3", "--hc", "2", "--swiglu-limit", "0", "--window", "16"]),
    # Ratio 4 source with a consumer between SWA layers, plain (non-YaRN) compressed rope,
    # 6 experts top-3, no Engram, window 8 < prompt 150.
    ("v41_r4_swa", 150, 12, [1, 13],
     A + ["--seed", "48", "--layers", "4", "--compress-ratios", "0,4,4,0", "--kv-sources", "1",
          "--index-sources", "1", "--engram-layers", "none", "--index-heads", "16",
          "--index-topk", "6", "--original-seq-len", "0", "--experts", "6", "--topk", "3",
          "--window", "8"]),
]

ROW_POS = [0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 150, 199, 200,
           255, 256, 270, 299]


def fmt(x):
    return float(f"{x:.8g}")


def build(name, args, mkmodel, root):
    model_dir = os.path.join(root, name)
    subprocess.run([mkmodel, "--out", model_dir] + args, check=True, stdout=subprocess.DEVNULL)
    return model_dir


def make_one(name, prompt_len, n_steps, chunks, args, model_dir):
    m = v41_ref.Model(model_dir)
    if m.unused:
        raise SystemExit(f"{name}: tensors the reference does not read: {m.unused[:8]}")
    if m.args.unknown:
        raise SystemExit(f"{name}: config keys the reference does not read: {m.args.unknown}")
    V = m.args.vocab_size
    rng = random.Random(3400 + sum(map(ord, name)))
    prompt = [rng.randrange(V) for _ in range(prompt_len)]
    row_pos = [p for p in ROW_POS if p < prompt_len - 1] + [prompt_len - 1]
    full, steps, greedy, stats = v41_ref.run(m, prompt, n_steps)
    selfcheck = {}
    for c in chunks:
        f2, s2, g2, st2 = v41_ref.run(m, prompt, n_steps, chunk=c)
        d = max(float(np.abs(f2 - full).max()), max(float(np.abs(a - b).max()) for a, b in zip(steps, s2)))
        selfcheck[f"chunk_{c}_max_abs_diff"] = d
        selfcheck[f"chunk_{c}_greedy_equal"] = g2 == greedy
    seq = m.new_sequence()
    once = m.forward(seq, prompt + greedy[:-1], 0, all_logits=True)
    selfcheck["decode_vs_prefill_max_abs_diff"] = float(max(
        np.abs(once[prompt_len - 1 + i] - steps[i]).max() for i in range(n_steps)))
    margins = []
    for r in steps:
        top = np.sort(r)[::-1]
        margins.append(fmt(float(top[0] - top[1])))
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    return {
        "name": name,
        "mkmodel_args": args,
        "prompt_ids": prompt,
        "row_pos": row_pos,
        "rows": [[fmt(v) for v in full[p].tolist()] for p in row_pos],
        "greedy_ids": greedy,
        "steps": [[fmt(v) for v in r.tolist()] for r in steps],
        "step_margins": margins,
        "selfcheck": selfcheck,
        "stats": stats,
        "config": config,
        "oracle": "tests/oracles/v41_ref.py",
        "numpy_version": np.__version__,
    }


def compare(a, b, tol=1e-4):
    """Committed fixture a vs regenerated b: same ids, logits within tol (relative to max |logit|)."""
    errs = []
    for k in ("mkmodel_args", "prompt_ids", "row_pos", "greedy_ids"):
        if a[k] != b[k]:
            errs.append(f"{k} differs")
    for k in ("rows", "steps"):
        ra, rb = np.array(a[k]), np.array(b[k])
        if ra.shape != rb.shape:
            errs.append(f"{k}: shape {ra.shape} vs {rb.shape}")
            continue
        d = float(np.abs(ra - rb).max() / max(1e-30, np.abs(ra).max()))
        if d > tol:
            errs.append(f"{k}: max rel diff {d:.3g}")
    return errs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mkmodel", default="build/mkmodel")
    ap.add_argument("--out", default="tests/fixtures/v41")
    ap.add_argument("--only", nargs="*", help="fixture names to (re)make; default all")
    ap.add_argument("--check", action="store_true", help="regenerate and compare with --out")
    o = ap.parse_args()
    shapes = [s for s in SHAPES if not o.only or s[0] in o.only]
    if not os.access(o.mkmodel, os.X_OK):
        sys.exit(f"make_v41_fixtures: {o.mkmodel} is not an executable (build mkmodel)")
    tmp_root = tempfile.mkdtemp(prefix="tm_v41_")
    bad = 0
    try:
        for name, prompt_len, n_steps, chunks, args in shapes:
            model_dir = build(name, args, o.mkmodel, tmp_root)
            fx = make_one(name, prompt_len, n_steps, [] if o.check else chunks, args, model_dir)
            path = os.path.join(o.out, name + ".json")
            if o.check:
                with open(path) as f:
                    errs = compare(json.load(f), fx)
                print(f"{path}: {'OK' if not errs else 'DIFFERS: ' + '; '.join(errs)}")
                bad += bool(errs)
                continue
            os.makedirs(o.out, exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(fx, f, separators=(",", ":"))
                f.write("\n")
            os.replace(path + ".tmp", path)
            print(f"wrote {path}: {prompt_len} prompt ids, greedy {fx['greedy_ids']}, "
                  f"min margin {min(fx['step_margins']):.3g}, selfcheck {fx['selfcheck']}, "
                  f"stats {fx['stats']}")
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
