#!/usr/bin/env python3
"""bench/v41_oracle_noise.py - how far the V4.1 NumPy oracle's logprobs move under (a) float32
instead of float64 accumulation in its matrix products (the rounding noise an engine's float32
GEMMs add, quantization boundaries included) and (b) the reference's literal shared index-key
pointer (tests/oracles/README.md), on the committed fixtures' models, plus the time per shape.

usage (repository root, mkmodel built): /usr/bin/python3 bench/v41_oracle_noise.py [build/mkmodel]
"""
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracles"))
import make_v41_fixtures as M  # noqa: E402
import v41_ref as R  # noqa: E402


def lsm(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def main():
    mk = sys.argv[1] if len(sys.argv) > 1 else "build/mkmodel"
    root = tempfile.mkdtemp(prefix="tm_v41_noise_")
    f64 = R.matmul
    for name, plen, nsteps, _, args in M.SHAPES:
        fx = json.load(open(os.path.join("tests", "fixtures", "v41", name + ".json")))
        d = M.build(name, args, mk, root)
        m = R.Model(d)
        t0 = time.time()
        f1, s1, g1, _ = R.run(m, fx["prompt_ids"], nsteps)
        t1 = time.time() - t0
        R.matmul = lambda x, wt: (np.asarray(x, np.float32) @ wt.astype(np.float32)).astype(np.float32)
        f2, s2, g2, _ = R.run(m, fx["prompt_ids"], nsteps)
        R.matmul = f64
        line = (f"{name}: prompt {plen} + {nsteps} steps in {t1:.2f} s; f32 accumulation: max|dlogprob| "
                f"prefill {np.abs(lsm(f1) - lsm(f2)).max():.2e} steps {np.abs(lsm(s1) - lsm(s2)).max():.2e} "
                f"greedy equal {g1 == g2}")
        R.LITERAL_INDEX_K = True
        try:
            m2 = R.Model(d)
            _, s3, g3, _ = R.run(m2, fx["prompt_ids"], nsteps)
            line += f"; literal index_k: steps {np.abs(lsm(s1) - lsm(s3)).max():.2e} greedy equal {g1 == g3}"
        except ValueError as e:
            line += f"; literal index_k: refused ({e})"
        R.LITERAL_INDEX_K = False
        print(line, flush=True)


if __name__ == "__main__":
    main()
