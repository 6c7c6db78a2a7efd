#!/usr/bin/env python3
"""tests/oracles/hf/make_quant_fixtures.py - oracle fixtures for quantized checkpoints (tests/unit/test_quant.c).

For each shape below: build a quantized random-weight model with tokenmill's mkmodel (--quant ...,
--expert-dtype fp4), dequantize every quantized weight in Python from the format's definition
(docs/quantization.md; element decoding by torch's own float8_e4m3fn / float8_e8m0fnu dtypes and an
e2m1 table, scales expanded over their blocks, one fp32 product per element), write that as an f32
model folder without quantization_config, load it with transformers (fp32, eager attention, CPU),
run a fixed seeded prompt, greedy-decode with a full recompute per step recording every step's
logits, and write tests/fixtures/hf_quant/<name>.json:

    {name, mkmodel_args, prompt_ids, greedy_ids, logits: [[n_vocab floats] * n_steps],
     reference: "python-dequant", native: {...}, transformers_version, torch_version}

(the layout of tests/fixtures/hf; logits[0] belongs to the prompt, logits[i] to the sequence after
greedy_ids[i-1]). test_quant rebuilds each model with `$TM_BUILD/mkmodel --out DIR <mkmodel_args>`
and requires max|a-b|/max|b| < 1e-4 per step and equal greedy tokens, as test_engine does for bf16.

`native` records transformers' own loading of the quantized folder where it supports the format
(quant_method fp8 with weight_block_size: FineGrainedFP8, which needs a GPU; compressed-tensors if
the package is installed): its greedy ids and the max abs logit difference from the reference, or
the reason it did not run. It is informational: transformers' FP8 linears quantize activations too
(per token group, dynamic), which the CPU reference does not (docs/quantization.md).

Needs torch (>= 2.7 for float8_e8m0fnu), transformers (tested with 5.17), safetensors; no network.
Usage (repository root, after building mkmodel):
    python3 tests/oracles/hf/make_quant_fixtures.py [--mkmodel build/mkmodel] [--out tests/fixtures/hf_quant]
Where the torch machine cannot build tokenmill: `--build-only DIR` writes the models to DIR/<name>;
copy DIR over and run with `--models DIR` there.
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
N_STEPS = 12

LLAMA = ["--arch", "llama", "--layers", "2", "--hidden", "128", "--heads", "4", "--kv-heads", "2",
         "--ff", "256", "--vocab", str(VOCAB), "--ctx", "512", "--dtype", "bf16"]
DSV4 = ["--arch", "deepseek_v4", "--layers", "3", "--dsv4-layers", "shc", "--dsv4-mlp", "hmm",
        "--hidden", "128", "--heads", "4", "--head-dim", "32", "--ff", "64", "--vocab", str(VOCAB),
        "--ctx", "4096", "--experts", "8", "--experts-used", "2", "--q-lora", "64", "--o-lora", "32",
        "--o-groups", "2", "--index-heads", "4", "--index-dim", "32", "--index-topk", "4",
        "--rope-dim", "8", "--window", "8", "--hca-ratio", "8", "--hc", "2", "--dtype", "bf16"]

SHAPES = [
    ("llama_fp8_block128", LLAMA + ["--seed", "21", "--quant", "fp8-block"]),
    ("llama_fp8_block32_ue8m0", LLAMA + ["--seed", "22", "--quant", "fp8-block-ue8m0",
                                         "--quant-block", "32"]),
    ("llama_fp8_channel", LLAMA + ["--seed", "23", "--quant", "fp8-channel"]),
    ("llama_fp8_tensor_static", LLAMA + ["--seed", "24", "--quant", "fp8-tensor",
                                         "--ct-static", "1"]),
    ("dsv4_fp8_mxfp4", DSV4 + ["--seed", "25", "--quant", "fp8-block-ue8m0", "--quant-block", "32",
                               "--expert-dtype", "fp4"]),
]

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def fmt(x):
    return float(f"{x:.7g}")


def build(name, args, mkmodel, root):
    model_dir = os.path.join(root, name)
    subprocess.run([mkmodel, "--out", model_dir] + args, check=True, stdout=subprocess.DEVNULL)
    return model_dir


def expand(scale, rows, cols, bo, bi):
    """A [.., ceil(R/bo), ceil(C/bi)] scale grid (or a scalar) as a [.., R, C] fp32 tensor."""
    s = scale.to(torch.float32)
    if s.dim() == 0 or (s.numel() == 1 and bo >= rows and bi >= cols):
        return s.reshape(()).expand(rows, cols)
    s = s.repeat_interleave(bo, dim=-2)[..., :rows, :]
    return s.repeat_interleave(bi, dim=-1)[..., :cols]


def dequant_folder(src, dst):
    """Write dst: src with every quantized weight dequantized to f32 (docs/quantization.md)."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    cfg = json.load(open(os.path.join(src, "config.json")))
    qc = cfg.pop("quantization_config")
    expert_fp4 = cfg.pop("expert_dtype", None) == "fp4"
    method = qc["quant_method"]
    if method == "fp8":
        bo, bi = qc.get("weight_block_size", [128, 128])
        suffix = "_scale_inv"
    else:  # compressed-tensors
        wcfg = next(iter(qc["config_groups"].values()))["weights"]
        strategy, suffix = wcfg["strategy"], "_scale"
    tensors = {}
    with safe_open(os.path.join(src, "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        for name in names:
            tensors[name] = f.get_tensor(name)
    out = {}
    for name, t in tensors.items():
        if name.endswith(suffix) and name[: -len(suffix)] in tensors:
            continue  # a scale: folded into its weight
        if name.endswith("input_scale"):
            continue  # static activation scale: the reference keeps activations in fp32
        if name + suffix not in tensors:
            out[name] = t.contiguous()
            continue
        s = tensors[name + suffix]
        if t.dtype in (torch.int8, torch.uint8):  # packed e2m1: element 2j low nibble, 2j+1 high
            assert expert_fp4, name
            b = t.view(torch.uint8).to(torch.int64)
            lut = torch.tensor(E2M1, dtype=torch.float32)
            vals = torch.stack([lut[b & 15], lut[b >> 4]], dim=-1).flatten(-2)
            rows, cols = vals.shape[-2], vals.shape[-1]
            w = vals * expand(s, rows, cols, 1, 32)  # e8m0 scale per 32 inputs
        else:
            assert t.dtype == torch.float8_e4m3fn, (name, t.dtype)
            vals = t.to(torch.float32)
            rows, cols = vals.shape[-2], vals.shape[-1]
            if method == "fp8":
                sb = expand(s, rows, cols, bo, bi)
            elif strategy == "channel":
                sb = s.to(torch.float32).reshape(-1, 1).expand(rows, cols)
            elif strategy == "tensor":
                sb = s.to(torch.float32).reshape(()).expand(rows, cols)
            else:
                b0, b1 = wcfg["block_structure"]
                sb = expand(s, rows, cols, b0, b1)
            w = vals * sb
        out[name] = w.to(torch.float32).contiguous()
    os.makedirs(dst, exist_ok=True)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(src, extra)):
            shutil.copy(os.path.join(src, extra), dst)


def load_fp32(model_dir, **extra):
    from transformers import AutoModelForCausalLM
    kw = dict(attn_implementation="eager", local_files_only=True, **extra)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kw)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, **kw)
    model.eval()
    return model


def greedy(model, prompt, device="cpu"):
    ids = list(prompt)
    toks, rows = [], []
    with torch.no_grad():
        for _ in range(N_STEPS):
            out = model(input_ids=torch.tensor([ids], device=device), use_cache=False)
            row = out.logits[0, -1].to(torch.float32).cpu()
            tok = int(torch.argmax(row).item())
            rows.append(row)
            toks.append(tok)
            ids.append(tok)
    return toks, rows


def native(model_dir, prompt, ref_rows):
    """transformers' own loading of the quantized folder, where it can (informational)."""
    try:
        cfg = json.load(open(os.path.join(model_dir, "config.json")))
        if cfg.get("expert_dtype") == "fp4":
            return {"ran": False, "why": "transformers has no MXFP4 path for DeepSeek-V4 experts"}
        if cfg["quantization_config"]["quant_method"] == "fp8" and not torch.cuda.is_available():
            return {"ran": False, "why": "FineGrainedFP8 needs a GPU"}
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        model = load_fp32(model_dir, device_map=dev)
        toks, rows = greedy(model, prompt, dev)
        diff = max(float((a - b).abs().max()) for a, b in zip(rows, ref_rows))
        return {"ran": True, "greedy_ids": toks, "max_abs_diff_vs_reference": fmt(diff)}
    except Exception as e:  # not supported here: say why
        return {"ran": False, "why": f"{type(e).__name__}: {str(e)[:300]}"}


def make_one(name, args, model_dir, out_dir, tmp_root):
    plain = os.path.join(tmp_root, name + "_dequant")
    dequant_folder(model_dir, plain)
    model = load_fp32(plain)
    rng = random.Random(2000 + sum(map(ord, name)))
    prompt = [rng.randrange(VOCAB) for _ in range(PROMPT_LEN)]
    toks, rows = greedy(model, prompt)
    fx = {
        "name": name,
        "mkmodel_args": args,
        "prompt_ids": prompt,
        "greedy_ids": toks,
        "logits": [[fmt(v) for v in r.tolist()] for r in rows],
        "reference": "python-dequant",
        "native": native(model_dir, prompt, rows),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    path = os.path.join(out_dir, name + ".json")
    with open(path + ".tmp", "w") as f:
        json.dump(fx, f, separators=(",", ":"))
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"wrote {path}: {len(prompt)} prompt ids, greedy {toks}, native {fx['native']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mkmodel", default="build/mkmodel")
    ap.add_argument("--out", default="tests/fixtures/hf_quant")
    ap.add_argument("--only", nargs="*", help="fixture names to (re)make; default all")
    ap.add_argument("--build-only", metavar="DIR", help="only write the models to DIR/<name>")
    ap.add_argument("--models", metavar="DIR", help="use models prebuilt with --build-only")
    a = ap.parse_args()
    shapes = [(n, args) for n, args in SHAPES if not a.only or n in a.only]
    if not a.models and not os.access(a.mkmodel, os.X_OK):
        sys.exit(f"make_quant_fixtures: {a.mkmodel} is not an executable (build mkmodel)")
    if a.build_only:
        for name, args in shapes:
            print(f"built {build(name, args, a.mkmodel, a.build_only)}")
        return
    global torch, transformers
    import torch
    import transformers
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    os.makedirs(a.out, exist_ok=True)
    tmp_root = tempfile.mkdtemp(prefix="tm_hfq_")
    try:
        for name, args in shapes:
            model_dir = os.path.join(a.models, name) if a.models else build(name, args, a.mkmodel,
                                                                            tmp_root)
            make_one(name, args, model_dir, a.out, tmp_root)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)


if __name__ == "__main__":
    main()
