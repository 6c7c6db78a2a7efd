#!/usr/bin/env python3
"""tests/oracles/make_v41_dspark_fixture.py - NumPy-oracle fixtures of the DeepSeek-V4.1 DSpark
draft pass (issue 37) for tests/unit/test_dsv41_dspark.c.

For each shape: build a random checkpoint with DSpark stages (mkmodel --arch deepseek_v41
--dspark N ...), load it with tests/oracles/v41_ref.py, and drive it as the reference's own
__main__ does (v41_ref.run_spec, greedy): prefill the prompt from start_pos 0 and seed the stages'
window KV (forward_spec at 0), then per decode step one main forward of the last token followed
by forward_spec at its position with the main model's next token as the anchor. Written:

    {name, mkmodel_args, prompt_ids, block_size, spec: [{pos, main (the anchor), draft (anchor +
     block_size greedy draft ids), logits ([block_size][n_vocab], Markov bias included, 8
     significant digits), confidence ([block_size])}], oracle, numpy_version}

The C test replays the same calls on the CPU engine (forward, then the draft op over the new rows
with want_logits at the decode steps) and compares log-softmax rows (bound in the test).

Usage (repository root, after building mkmodel):
  python3 tests/oracles/make_v41_dspark_fixture.py [--mkmodel build/mkmodel]
      [--out tests/fixtures/v41/dspark] [--check]
--check regenerates into a temporary folder and compares with the committed fixtures.
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

A = ["--arch", "deepseek_v41"]
# (name, prompt length, decode steps, mkmodel args)
SHAPES = [
    # 3 backbone layers (SWA, ratio 2, ratio 1, Engram on 0), 2 DSpark stages with their own
    # expert counts (6 experts, top 3), block 4, targets 0 and 2, Markov rank 32, window 8 <
    # prompt 20 (the stages' window wraps).
    ("v41_dspark_2stage", 20, 4,
     A + ["--seed", "37", "--layers", "3", "--compress-ratios", "0,2,1,0,0", "--kv-sources", "1,2",
          "--index-sources", "1,2", "--engram-layers", "0", "--window", "8", "--dspark", "2",
          "--dspark-block", "4", "--dspark-targets", "0,2", "--markov-rank", "32",
          "--dspark-experts", "6", "--dspark-topk", "3"]),
    # 1 stage, block 6, one target layer (the last), 2 hc copies, window 16, prompt 12 (< window).
    ("v41_dspark_1stage", 12, 3,
     A + ["--seed", "38", "--layers", "2", "--compress-ratios", "0,1,0", "--kv-sources", "1",
          "--index-sources", "1", "--engram-layers", "none", "--window", "16", "--hc", "2",
          "--dspark", "1", "--dspark-block", "6", "--dspark-targets", "1",
          "--markov-rank", "64"]),
]


def g8(x):
    return [float(f"{v:.8g}") for v in np.asarray(x, dtype=np.float64).ravel()]


def make(mkmodel, out, name, n_prompt, n_steps, args):
    d = tempfile.mkdtemp(prefix="v41ds_")
    try:
        subprocess.run([mkmodel, "--out", d] + args, check=True, stdout=subprocess.DEVNULL)
        m = v41_ref.Model(d)
        rng = random.Random(name)
        prompt = [rng.randrange(1, m.args.vocab_size - 1) for _ in range(n_prompt)]
        steps = []
        seq = m.new_sequence()
        row = m.forward(seq, prompt, 0)
        tok = int(np.argmax(row))
        m.forward_spec(seq, tok, seq.main_hidden, 0)
        for _ in range(n_steps):
            p = seq.pos
            row = m.forward(seq, [tok], p)
            nxt = int(np.argmax(row))
            ids, logits, conf = m.forward_spec(seq, nxt, seq.main_hidden, p)
            steps.append({"pos": p, "token": tok, "main": nxt, "draft": ids,
                          "logits": [g8(r) for r in logits], "confidence": g8(conf)})
            tok = nxt
        fx = {"name": name, "mkmodel_args": args, "prompt_ids": prompt,
              "block_size": m.args.dspark_block_size, "spec": steps,
              "oracle": "tests/oracles/v41_ref.py forward_spec", "numpy_version": np.__version__}
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump(fx, f, separators=(",", ":"))
            f.write("\n")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mkmodel", default="build/mkmodel")
    ap.add_argument("--out", default="tests/fixtures/v41/dspark")
    ap.add_argument("--check", action="store_true")
    o = ap.parse_args()
    out = tempfile.mkdtemp(prefix="v41dsfx_") if o.check else o.out
    os.makedirs(out, exist_ok=True)
    bad = 0
    for name, n_prompt, n_steps, args in SHAPES:
        make(o.mkmodel, out, name, n_prompt, n_steps, args)
        if o.check:
            a = open(os.path.join(out, name + ".json")).read()
            b = open(os.path.join(o.out, name + ".json")).read()
            if a != b:
                print(f"{name}: differs from the committed fixture")
                bad = 1
        print(f"{name}: ok")
    if o.check:
        shutil.rmtree(out, ignore_errors=True)
    sys.exit(bad)


if __name__ == "__main__":
    main()
