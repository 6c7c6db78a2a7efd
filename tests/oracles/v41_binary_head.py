#!/usr/bin/env python3
"""tests/oracles/v41_binary_head.py MODEL_DIR [A B] - make an mkmodel DeepSeek-V4.1 checkpoint
with DSpark stages a two-token model by construction, for acceptance tests of speculative
decoding on random weights (docs/speculative.md "DSpark": measuring acceptance).

In place, in the safetensors shard that holds them: the final norm (norm.weight) and the last
DSpark stage's norm (mtp.<last>.norm.weight) keep only channel 0 (weight 1, the rest 0); the LM
head (head.weight, shared by the drafter) becomes 0 but for row A = +8 and row B = -8 in channel
0; the Markov head's output (mtp.<last>.markov_head.head.weight) becomes 0. Every other weight
stays random. So the target's argmax is A or B by the sign of its final hidden channel 0, and
the drafter's picks are A or B by the sign of its own: a draft is accepted only when the two
signs agree, which random weights make happen about half the time, so a verification that is
correct must both accept and reject drafts. Plain Python (no NumPy); bf16 values written as the
upper half of their float32 bits (exact for 0, 1 and +-8)."""
import json
import os
import struct
import sys


def bf16(x):
    return struct.pack("<f", x)[2:]


def main():
    d = sys.argv[1]
    A = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    B = int(sys.argv[3]) if len(sys.argv) > 3 else 101
    cfg = json.load(open(os.path.join(d, "inference", "config.json")))
    last = cfg["n_mtp_layers"] - 1
    want = {"norm.weight", f"mtp.{last}.norm.weight", "head.weight",
            f"mtp.{last}.markov_head.head.weight"}
    done = set()
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        p = os.path.join(d, f)
        with open(p, "r+b") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
            base = 8 + n
            for name in want & set(hdr):
                t = hdr[name]
                assert t["dtype"] == "BF16", (name, t["dtype"])
                b0, b1 = t["data_offsets"]
                shape = t["shape"]
                buf = bytearray(b1 - b0)  # zeros
                if name.endswith("norm.weight"):
                    buf[0:2] = bf16(1.0)
                elif name == "head.weight":
                    D = shape[1]
                    buf[2 * A * D:2 * A * D + 2] = bf16(8.0)
                    buf[2 * B * D:2 * B * D + 2] = bf16(-8.0)
                fh.seek(base + b0)
                fh.write(bytes(buf))
                done.add(name)
    missing = want - done
    if missing:
        sys.exit(f"v41_binary_head: tensors not found: {sorted(missing)}")


if __name__ == "__main__":
    main()
