#!/usr/bin/env python3
"""NumPy's side of tests/unit/test_engram_numpy.c: the DeepSeek-V4.1 Engram hash multipliers as
the reference's inference/engram.py compute_hash_multipliers draws them, and raw
Generator.integers draws, for the C implementation (runner/model/engram_hash.c) to match bit for
bit.

usage: engram_numpy.py MAX_NGRAM V [V ...]
prints "numpy <version>", then for each vocab size V and layer id 0..63 one line
"mul <layer> <V> <m_0> .. <m_{MAX_NGRAM-1}>", then "int <seed> <high> <n> <v_0> ..." lines for
the draws listed in INTS.
"""
import sys

import numpy as np

# (seed, high, n): both Lemire paths (32-bit buffered below 2^32, 64-bit above), the boundary
# where high - 1 == 2^32 - 1 (next_uint32 taken as is), high 1 (no draw), seeds of two 32-bit
# words, and a long run through the 32-bit buffer.
INTS = [
    (0, 1, 4), (0, 2, 8), (1, 3, 8), (10007, 1000, 16), (12345, 2**31 + 11, 16),
    (7, 2**32 - 1, 8), (7, 2**32, 8), (7, 2**32 + 1, 8), (99, 2**62, 8), (99, 2**63 - 1, 8),
    (2**32 + 5, 97, 8), (2**40 + 3, 2**50, 8), (2**63 + 9, 12, 8), (2**64 - 1, 2**33, 8),
    (630441, 46543223254, 1000), (5, 3, 1001),
]


def main():
    max_ngram = int(sys.argv[1])
    print("numpy", np.__version__)
    for v in (int(x) for x in sys.argv[2:]):
        bound = max(1, (np.iinfo(np.int64).max // v) // 2)
        for layer in range(64):
            g = np.random.default_rng(10007 * layer)
            vals = g.integers(low=0, high=bound, size=(max_ngram,), dtype=np.int64) * 2 + 1
            print("mul", layer, v, " ".join(str(int(x)) for x in vals))
    for seed, high, n in INTS:
        vals = np.random.default_rng(seed).integers(low=0, high=high, size=(n,), dtype=np.int64)
        print("int", seed, high, n, " ".join(str(int(x)) for x in vals))


if __name__ == "__main__":
    main()
