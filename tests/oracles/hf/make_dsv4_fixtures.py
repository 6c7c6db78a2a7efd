#!/usr/bin/env python3
"""tests/oracles/hf/make_dsv4_fixtures.py - Hugging Face oracle fixtures for tests/unit/test_dsv4.c.

For each DeepSeek-V4 shape below: build a random-weight model with tokenmill's mkmodel
(--arch deepseek_v4), load it with transformers 5.17 (DeepseekV4ForCausalLM, fp32, eager
attention, CPU), check that every tensor of the safetensors file landed in the model unchanged,
run a fixed seeded prompt in one forward pass with the cache on, record the logits at a few
prompt positions, then greedy-decode N_STEPS tokens one forward call at a time through the cache
(the compressors' incremental path) recording every step's logits, and write
tests/fixtures/hf_dsv4/<name>.json:

    {name, mkmodel_args, prompt_ids, row_pos, rows: [[n_vocab floats]] (logits at prompt
     positions row_pos), greedy_ids, steps: [[n_vocab floats] * N_STEPS], inv_freq_main,
     inv_freq_compress, recompute_max_abs_diff, transformers_version, torch_version}

steps[0] is the prompt's last position; steps[i] (i >= 1) the sequence after greedy_ids[i-1] was
appended; greedy_ids[i] = argmax(steps[i]) (lowest id on ties). Floats keep 8 significant
digits. recompute_max_abs_diff compares the last cached decode step with a cache-free forward of
the whole sequence (transformers' own consistency; informational). test_dsv4 rebuilds each model
with `$TM_BUILD/mkmodel --out DIR <mkmodel_args>` and compares.

Usage (repository root, after building mkmodel): python3 tests/oracles/hf/make_dsv4_fixtures.py
  [--mkmodel build/mkmodel] [--out tests/fixtures/hf_dsv4] [--only NAME..]
Where the torch machine cannot build tokenmill: `--build-only DIR` writes the models to
DIR/<name> here; copy DIR over and run with `--models DIR` there.
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

N_STEPS = 12

SHAPES = [
    # All three attention types and both MoE types; window 32 < prompt; CSA top-k 8 of up to 75
    # compressed entries; two closed HCA windows of 128; yarn compress rope; 4 HC streams; f32.
    ("dsv4_mix_f32", 300,
     ["--arch", "deepseek_v4", "--seed", "21", "--layers", "4", "--dsv4-layers", "schc",
      "--dsv4-mlp", "hhmm", "--hidden", "64", "--heads", "4", "--head-dim", "32", "--ff", "32",
      "--vocab", "256", "--ctx", "4096", "--dtype", "f32", "--window", "32", "--index-topk", "8",
      "--index-heads", "16", "--index-dim", "16", "--rope-dim", "8", "--hc", "4", "--q-lora", "32",
      "--o-groups", "2", "--o-lora", "16", "--experts", "4", "--experts-used", "2"]),
    # HCA first, the real window 128 (prompt 290 > 2 windows), CSA seeing every entry (top-k 512),
    # 2 HC streams, 6 experts top-3, bf16 weights, tied embeddings.
    ("dsv4_hca_bf16", 290,
     ["--arch", "deepseek_v4", "--seed", "22", "--layers", "3", "--dsv4-layers", "hcs",
      "--dsv4-mlp", "hmm", "--hidden", "48", "--heads", "2", "--head-dim", "64", "--ff", "24",
      "--vocab", "256", "--ctx", "4096", "--dtype", "bf16", "--window", "128",
      "--index-topk", "512", "--index-heads", "3", "--index-dim", "16", "--rope-dim", "16",
      "--hc", "2", "--q-lora", "24", "--o-groups", "2", "--o-lora", "12", "--experts", "6",
      "--experts-used", "3", "--tied", "1"]),
    # Plain (non-yarn) compress rope, HCA ratio 16 (many HCA entries), window 16, top-k 4,
    # 8 heads in 4 output groups, 3 HC streams.
    ("dsv4_r16_f32", 200,
     ["--arch", "deepseek_v4", "--seed", "23", "--layers", "3", "--dsv4-layers", "chs",
      "--dsv4-mlp", "mhm", "--hidden", "32", "--heads", "8", "--head-dim", "16", "--ff", "16",
      "--vocab", "256", "--ctx", "4096", "--dtype", "f32", "--window", "16", "--index-topk", "4",
      "--index-heads", "16", "--index-dim", "8", "--rope-dim", "4", "--hc", "3", "--q-lora", "16",
      "--o-groups", "4", "--o-lora", "8", "--experts", "5", "--experts-used", "2",
      "--hca-ratio", "16", "--yarn", "0"]),
]

# Indexer scores are sum_h w_h * relu(q_h . k): with few heads, exact-zero ties at the top-k
# boundary are common and torch.topk breaks them arbitrarily, so the shapes with top-k below the
# entry count use 16 indexer heads (an all-zero tie then needs 16 negative weights).
ROW_POS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 100, 126, 127, 128, 129,
           150, 199, 200, 255, 256, 257, 270, 289, 299]


def fmt(x):
    return float(f"{x:.8g}")


def build(name, args, mkmodel, root):
    model_dir = os.path.join(root, name)
    subprocess.run([mkmodel, "--out", model_dir] + args, check=True, stdout=subprocess.DEVNULL)
    return model_dir


def load_checked(model_dir):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", local_files_only=True,
        output_loading_info=True)
    model.eval()
    bad = {k: v for k, v in info.items() if v}
    if bad:
        print(f"  loading info: {bad}")
    assert not info.get("missing_keys"), info
    assert not info.get("unexpected_keys"), info
    sd = model.state_dict()
    want = load_file(os.path.join(model_dir, "model.safetensors"))
    fixed = 0
    for k, v in want.items():
        assert k in sd, f"{k} not in the model"
        got = sd[k]
        if k.endswith("tid2eid"):
            if not torch.equal(got.long(), v.long()):
                # transformers may not cast a float file tensor into the long buffer; set it.
                mod = model.get_submodule(k.rsplit(".", 1)[0])
                mod.tid2eid.copy_(v.long())
                fixed += 1
            continue
        assert got.shape == v.shape, (k, got.shape, v.shape)
        assert torch.equal(got.float(), v.float()), f"{k} differs after loading"
    if fixed:
        print(f"  tid2eid set by hand in {fixed} layers")
    return model


def make_one(name, prompt_len, args, model_dir, out_dir):
    model = load_checked(model_dir)
    cfg = model.config
    rng = random.Random(2000 + sum(map(ord, name)))
    prompt = [rng.randrange(cfg.vocab_size) for _ in range(prompt_len)]
    row_pos = [p for p in ROW_POS if p < prompt_len - 1] + [prompt_len - 1]
    greedy, steps = [], []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        cache = out.past_key_values
        full = out.logits[0].to(torch.float32)
        rows = [[fmt(v) for v in full[p].tolist()] for p in row_pos]
        row = full[-1]
        for i in range(N_STEPS):
            tok = int(torch.argmax(row).item())
            steps.append([fmt(v) for v in row.tolist()])
            greedy.append(tok)
            if i + 1 == N_STEPS:
                break
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            row = out.logits[0, -1].to(torch.float32)
        ids = prompt + greedy[:-1]
        ref = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
        recompute = float((ref - row).abs().max().item())
    rot = model.model.rotary_emb
    fx = {
        "name": name,
        "mkmodel_args": args,
        "prompt_ids": prompt,
        "row_pos": row_pos,
        "rows": rows,
        "greedy_ids": greedy,
        "steps": steps,
        "inv_freq_main": [float(x) for x in rot.main_inv_freq.tolist()],
        "inv_freq_compress": [float(x) for x in rot.compress_inv_freq.tolist()],
        "recompute_max_abs_diff": recompute,
        "layer_types": list(cfg.layer_types),
        "mlp_layer_types": list(cfg.mlp_layer_types),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    path = os.path.join(out_dir, name + ".json")
    with open(path + ".tmp", "w") as f:
        json.dump(fx, f, separators=(",", ":"))
        f.write("\n")
    os.replace(path + ".tmp", path)
    mx = max(abs(v) for r in steps for v in r)
    print(f"wrote {path}: {prompt_len} prompt ids, greedy {greedy}, max |logit| {mx:.3g}, "
          f"cached-vs-recompute max diff {recompute:.3g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mkmodel", default="build/mkmodel")
    ap.add_argument("--out", default="tests/fixtures/hf_dsv4")
    ap.add_argument("--only", nargs="*", help="fixture names to (re)make; default all")
    ap.add_argument("--build-only", metavar="DIR", help="only write the models to DIR/<name>")
    ap.add_argument("--models", metavar="DIR", help="use models prebuilt with --build-only")
    a = ap.parse_args()
    shapes = [s for s in SHAPES if not a.only or s[0] in a.only]
    if not a.models and not os.access(a.mkmodel, os.X_OK):
        sys.exit(f"make_dsv4_fixtures: {a.mkmodel} is not an executable (build mkmodel)")
    if a.build_only:
        for name, _, args in shapes:
            print(f"built {build(name, args, a.mkmodel, a.build_only)}")
        return
    global torch, transformers
    import torch
    import transformers
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    os.makedirs(a.out, exist_ok=True)
    tmp_root = tempfile.mkdtemp(prefix="tm_dsv4_")
    try:
        for name, prompt_len, args in shapes:
            model_dir = (os.path.join(a.models, name) if a.models
                         else build(name, args, a.mkmodel, tmp_root))
            make_one(name, prompt_len, args, model_dir, a.out)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)


if __name__ == "__main__":
    main()
