#!/usr/bin/env python3
"""tests/oracles/v41_dump_compare.py - where the NumPy oracle and DeepSeek's torch reference part.

v41_torch_ref.py --dump saves a fixture's prefill intermediates from the reference (forward hooks:
each layer's Engram, attention and MoE outputs, the block output, the logits) as DIR/<name>.npz.
This script recomputes the same prefill with the NumPy oracle (tests/oracles/v41_ref.py, one chunk
from position 0, the mkmodel checkpoint of the fixture) recording the same values, and prints, in
forward order, each one's max |difference| relative to its max |value|, so the first place where
they part is plain. No torch needed.

Usage:
  python3 tests/oracles/v41_dump_compare.py --mkmodel build/mkmodel \
      --fixture tests/fixtures/v41/v41_tiny.json --dump DIR/v41_tiny.npz
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v41_ref  # noqa: E402


def record(model, store):
    """Wrap the oracle's sublayer methods so the first call of each layer's sublayer is kept."""
    idx = {id(L): i for i, L in enumerate(model.layers)}

    def wrap(name, fn, pick=lambda r: r):
        def inner(L, *args, **kw):
            r = fn(L, *args, **kw)
            key = f"L{idx.get(id(L), -1)}.{name}"
            if key not in store:
                store[key] = np.array(pick(r), dtype=np.float32)
            return r
        return inner

    model.engram = wrap("engram", model.engram)
    model.attention = wrap("attn", model.attention)
    model.moe = wrap("ffn", model.moe)
    model.block = wrap("out", model.block, pick=lambda r: r[0])
    topk = model.topk_idxs

    def topk_rec(L, seq, *args):
        r = topk(L, seq, *args)
        if L.is_index_source and f"L{L.id}.index" not in store:
            store[f"L{L.id}.index"] = [set(int(v) for v in row) for row in r]
            if L.id == model.args.candidate_source_layer and seq.shared.candidates is not None:
                store[f"L{L.id}.candidates"] = np.array(seq.shared.candidates, dtype=np.float32)
        return r

    model.topk_idxs = topk_rec


def compare_index(key, ref_idx, mine, n_tok):
    """ref_idx: the reference's picks [1, S, k] (offset by S, -1 unreachable); mine: per position
    the oracle's set of picked compressed positions."""
    rows = ref_idx.reshape(n_tok, -1)
    bad = [p for p in range(n_tok) if {int(v) - n_tok for v in rows[p] if v >= 0} != mine[p]]
    if bad:
        p = bad[0]
        ref_set = sorted(int(v) - n_tok for v in rows[p] if v >= 0)
        print(f"{key:12s} picks differ at {len(bad)} of {n_tok} positions; first {p}: reference "
              f"{ref_set}, oracle {sorted(mine[p])}")
    else:
        print(f"{key:12s} picks equal at all {n_tok} positions")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mkmodel", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--dump", required=True, help="the reference's npz (v41_torch_ref.py --dump)")
    a = ap.parse_args()
    with open(a.fixture) as fh:
        fx = json.load(fh)
    ref = np.load(a.dump)
    work = tempfile.mkdtemp(prefix="v41dump_")
    try:
        subprocess.run([a.mkmodel, "--out", work, *fx["mkmodel_args"]], check=True,
                       stdout=subprocess.DEVNULL)
        model = v41_ref.Model(work)
        store = {}
        record(model, store)
        seq = model.new_sequence()
        store["logits"] = model.forward(seq, fx["prompt_ids"], 0, all_logits=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    n_tok = len(fx["prompt_ids"])
    for k in sorted(k for k in store if k.endswith(".index") and k in ref.files):
        compare_index(k, ref[k], store[k], n_tok)
    for k in sorted(k for k in store if k.endswith(".candidates") and k in ref.files):
        a, b = ref[k].reshape(n_tok, -1), store[k]
        n = min(a.shape[1], b.shape[1])
        diff = np.nonzero((a[:, :n] > 0) != (b[:, :n] > 0))[0]
        print(f"{k:12s} " + (f"masks differ at {len(set(diff.tolist()))} positions, first {int(diff[0])}"
                             if diff.size else "masks equal"))

    def order(k):
        if k == "logits":
            return (1 << 30, 0)
        layer, part = k[1:].split(".")
        return (int(layer), ["engram", "attn", "ffn", "out"].index(part))

    first = None
    for k in sorted((set(store) & set(ref.files)) - {k for k in store if k.endswith((".index", ".candidates"))},
                    key=order):
        t = ref[k].reshape(store[k].shape) if ref[k].size == store[k].size else None
        if t is None:
            print(f"{k}: shapes differ: torch {ref[k].shape}, NumPy {store[k].shape}")
            continue
        d = np.abs(t.astype(np.float64) - store[k])
        rel = float(d.max() / max(np.abs(store[k]).max(), 1e-30))
        # per position: the first token whose values part
        per_pos = d.reshape(d.shape[0] if d.ndim > 1 else 1, -1).max(-1) if d.ndim > 1 else d
        bad = np.nonzero(per_pos > 0.05 * max(np.abs(store[k]).max(), 1e-30))[0]
        where = f", first position over 5%: {int(bad[0])}" if bad.size else ""
        print(f"{k:12s} max|d|/max|x| {rel:.3g}{where}")
        if first is None and rel > 0.05:
            first = k
    missing = sorted((set(ref.files) ^ set(store)) - {k for k in ref.files if k.endswith((".index", ".candidates"))})
    if missing:
        print(f"only on one side: {missing}")
    print(f"first intermediate over 5%: {first}")


if __name__ == "__main__":
    sys.exit(main())
