#!/usr/bin/env python3
"""tests/oracles/hf/make_fixtures.py - Hugging Face oracle fixtures for tests/unit/test_engine.c.

For each shape below: build a random-weight model with tokenmill's mkmodel, load it with
transformers (AutoModelForCausalLM, fp32, eager attention, CPU), run a fixed seeded prompt, record
the logits of the prompt's last position, then greedy-decode a few steps recording every step's
logits, and write tests/fixtures/hf/<name>.json:

    {name, mkmodel_args, prompt_ids, greedy_ids, logits: [[n_vocab floats] * n_steps],
     transformers_version, torch_version}

logits[0] belongs to the prompt; logits[i] (i >= 1) to the sequence after greedy_ids[i-1] was
appended; greedy_ids[i] = argmax(logits[i]) (lowest id on ties). Floats keep 7 significant digits.
test_engine rebuilds each model with `$TM_BUILD/mkmodel --out DIR <mkmodel_args>` and compares.

Needs torch + transformers (tested with 5.17); no network. Usage (from the repository root, after
building mkmodel):  python3 tests/oracles/hf/make_fixtures.py [--mkmodel build/mkmodel] [--out tests/fixtures/hf]
Where the torch machine cannot build tokenmill: `--build-only DIR` (no torch needed) writes the
models to DIR/<name>; copy DIR over and run with `--models DIR` there.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

torch = transformers = None  # imported in main() unless --build-only

VOCAB = 512
PROMPT_LEN = 40
N_STEPS = 12  # rows of logits: the prompt + 11 decode steps; 12 greedy tokens

COMMON = ["--layers", "2", "--hidden", "64", "--ff", "160", "--vocab", str(VOCAB), "--ctx", "512"]

SHAPES = [
    # Llama: GQA 4:2, untied lm_head, llama3 rope scaling
    ("llama_gqa_llama3_f32", ["--arch", "llama", "--seed", "11", "--heads", "4", "--kv-heads", "2",
                              "--tied", "0", "--dtype", "f32", "--rope-scaling", "llama3"]),
    ("llama_gqa_llama3_bf16", ["--arch", "llama", "--seed", "11", "--heads", "4", "--kv-heads", "2",
                               "--tied", "0", "--dtype", "bf16", "--rope-scaling", "llama3"]),
    # Qwen2: q/k/v bias, tied embeddings, theta 1e6
    ("qwen2_bias_tied_f32", ["--arch", "qwen2", "--seed", "12", "--heads", "4", "--kv-heads", "2",
                             "--tied", "1", "--dtype", "f32", "--rope-theta", "1000000"]),
    ("qwen2_bias_tied_bf16", ["--arch", "qwen2", "--seed", "12", "--heads", "4", "--kv-heads", "2",
                              "--tied", "1", "--dtype", "bf16", "--rope-theta", "1000000"]),
    # Mistral: GQA 4:1, head_dim 24 (q width 96 != hidden 64), f16 weights, 3 layers
    ("mistral_gqa_hd24_f16", ["--arch", "mistral", "--seed", "13", "--heads", "4", "--kv-heads", "1",
                              "--head-dim", "24", "--tied", "0", "--dtype", "f16", "--layers", "3"]),
]


def load_fp32(model_dir):
    from transformers import AutoModelForCausalLM
    kw = dict(attn_implementation="eager", local_files_only=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kw)
    except TypeError:  # older transformers spell it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, **kw)
    model.eval()
    for p in model.parameters():
        assert p.dtype == torch.float32, p.dtype
    return model


def fmt(x):
    return float(f"{x:.7g}")


def build(name, args, mkmodel, root):
    """mkmodel into root/name; later duplicates (e.g. --layers) override earlier ones."""
    model_dir = os.path.join(root, name)
    subprocess.run([mkmodel, "--out", model_dir] + COMMON + args, check=True,
                   stdout=subprocess.DEVNULL)
    return model_dir


def make_one(name, args, model_dir, out_dir):
    from transformers import AutoConfig
    mk_args = COMMON + args
    cfg = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    model = load_fp32(model_dir)
    rng = random.Random(1000 + sum(map(ord, name)))
    prompt = [rng.randrange(VOCAB) for _ in range(PROMPT_LEN)]
    ids = list(prompt)
    greedy, rows = [], []
    with torch.no_grad():
        for _ in range(N_STEPS):
            # full recompute each step: no cache path involved, the plain definition of the model
            out = model(input_ids=torch.tensor([ids]), use_cache=False)
            row = out.logits[0, -1].to(torch.float32)
            tok = int(torch.argmax(row).item())  # first maximum = lowest id on ties
            rows.append([fmt(v) for v in row.tolist()])
            greedy.append(tok)
            ids.append(tok)
    fx = {
        "name": name,
        "mkmodel_args": mk_args,
        "prompt_ids": prompt,
        "greedy_ids": greedy,
        "logits": rows,
        "model_type": cfg.model_type,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    path = os.path.join(out_dir, name + ".json")
    with open(path + ".tmp", "w") as f:
        json.dump(fx, f, separators=(",", ":"))
        f.write("\n")
    os.replace(path + ".tmp", path)
    mx = max(abs(v) for r in rows for v in r)
    print(f"wrote {path}: {cfg.model_type}, {len(prompt)} prompt ids, {len(greedy)} greedy ids "
          f"{greedy}, max |logit| {mx:.3g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mkmodel", default="build/mkmodel")
    ap.add_argument("--out", default="tests/fixtures/hf")
    ap.add_argument("--only", nargs="*", help="fixture names to (re)make; default all")
    ap.add_argument("--build-only", metavar="DIR", help="only write the models to DIR/<name>")
    ap.add_argument("--models", metavar="DIR", help="use models prebuilt with --build-only")
    a = ap.parse_args()
    shapes = [(n, args) for n, args in SHAPES if not a.only or n in a.only]
    if not a.models and not os.access(a.mkmodel, os.X_OK):
        sys.exit(f"make_fixtures: {a.mkmodel} is not an executable (build the mkmodel target)")
    if a.build_only:
        for name, args in shapes:
            print(f"built {build(name, args, a.mkmodel, a.build_only)}")
        return
    global torch, transformers
    import torch
    import transformers
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    os.makedirs(a.out, exist_ok=True)
    tmp_root = tempfile.mkdtemp(prefix="tm_hf_")
    try:
        for name, args in shapes:
            if a.models:
                model_dir = os.path.join(a.models, name)
            else:
                model_dir = build(name, args, a.mkmodel, tmp_root)
            make_one(name, args, model_dir, a.out)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)


if __name__ == "__main__":
    main()
