#!/usr/bin/env python3
"""tests/oracles/v41_torch_ref.py - run DeepSeek's own V4.1 reference (torch) on mkmodel checkpoints.

The NumPy oracle (tests/oracles/v41_ref.py) is a transliteration; this harness runs the vendored
reference itself - inference/model.py + inference/engram.py + the kernel module (the torch port
kernel_cpu.py of the release's tilelang kernel.py) - which is NOT part of this repository: the
caller passes the folder holding those three files (--ref; bench/dsv41_device.sh --prep puts copies
into its git-ignored carry folder, with a MANIFEST saying where each came from). The harness only:

- builds a package from the three files plus two placeholder modules for the vision imports
  (image_processor: the four span-type constants; vision: ViT/Aligner that refuse to be built):
  vision_n_layers is 0 in every mkmodel checkpoint, so neither is used;
- makes ModelArgs from the checkpoint's inference/config.json (the reference's own key names),
  max_batch_size 1, max_seq_len sized for the run, temperature 0;
- builds Transformer(args, tokenizer) with torch's default dtype bf16 (as the release's
  generate.py) on --device (cpu or cuda: torch.set_default_device before the import, so the kernel
  module's tables live there too); the tokenizer is the checkpoint's tokenizer.json through the
  `tokenizers` package (the Engram token map is built by engram.py itself);
- loads every parameter from the safetensors shards (own reader; F8_E4M3 / F8_E8M0 / I8-packed
  FP4 copied bit for bit; attn.wo_a, FP8 in the release but bf16 in the reference, dequantized as
  the release's convert.py does: e4m3 x ue8m0 block scale in fp32, rounded to bf16); a checkpoint
  tensor left over or a parameter missing is an error naming it;
- prefills the fixture's prompt from start_pos 0 in one forward (the head asked for all positions'
  logits), then greedy-decodes one token per forward (its own argmax, lowest id on ties), and
  writes a fixture in the shape of tests/fixtures/v41/*.json (rows at the same row_pos, steps,
  greedy_ids, step_margins), plus the comparison with the NumPy fixture it started from: max
  |d logprob| over the rows and over the steps whose inputs agree, and how many greedy ids agree.

With --fp32 the same reference code runs with float32 activations: torch.bfloat16 is made an alias
of torch.float32 before the reference is imported, so its default dtype, its explicit bf16 casts
(Engram values, sparse_attn's probabilities and output) and its kernel module's bf16 asserts all
become float32; the quantization points (act_quant, fp4_act_quant, FP8/FP4 GEMMs, the bf16-rounded
wo_a) are unchanged. That is the reference's arithmetic without bf16 rounding between ops - what
tokenmill's CPU engine and the NumPy oracle compute - so it checks their semantics tightly, where
the bf16 run differs from any float32 implementation by bf16 noise amplified by the FP8 activation
quantization. --dump DIR saves each fixture's prefill intermediates (embedding, each layer's Engram,
attention, MoE and block outputs, logits) as float32 arrays in DIR/<name>.npz.

Usage:
  python3 tests/oracles/v41_torch_ref.py --ref DIR --mkmodel BUILD/mkmodel \
      --fixture tests/fixtures/v41/v41_tiny.json [--fixture ...] --out DIR [--device cuda] \
      [--fp32] [--dump DIR]
  python3 tests/oracles/v41_torch_ref.py --compare A.json B.json   # two fixtures, no torch needed
  python3 tests/oracles/v41_torch_ref.py --ref DIR --selftest [--device cuda]   # the quantizers:
      the reference's act_quant / fp4_act_quant against the NumPy oracle's, bit for bit
"""
import argparse
import importlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

PLACEHOLDER_IMAGE_PROCESSOR = '''"""Placeholder written by tokenmill's tests/oracles/v41_torch_ref.py (not reference code):
model.py imports these names; text-only checkpoints never use them."""
TEXT, IMAGE, IMAGE_START, IMAGE_END, IMAGE_NEW_LINE = -1, 0, 1, 2, 3
'''
PLACEHOLDER_VISION = '''"""Placeholder written by tokenmill's tests/oracles/v41_torch_ref.py (not reference code):
model.py imports ViT/Aligner; vision_n_layers is 0 in every mkmodel checkpoint."""


class ViT:
    def __init__(self, *a, **k):
        raise NotImplementedError("vision tower not carried (vision_n_layers must be 0)")


Aligner = ViT
'''
REF_FILES = ("model.py", "engram.py", "kernel_cpu.py")
FP32 = {"on": False, "bf16": None}  # --fp32: the real bfloat16 dtype, kept for the checkpoint reader


def fp32_mode():
    """Alias torch.bfloat16 to torch.float32 (before the reference is imported); see the docstring."""
    import torch

    if not FP32["on"]:
        FP32["on"], FP32["bf16"] = True, torch.bfloat16
        torch.bfloat16 = torch.float32


# ---------------------------------------------------------------------------------------------
# comparisons (plain Python + json: usable without torch)
# ---------------------------------------------------------------------------------------------
def log_softmax(row):
    m = max(row)
    s = math.fsum(math.exp(v - m) for v in row)
    ls = m + math.log(s)
    return [v - ls for v in row]


def max_lp_diff(a, b):
    la, lb = log_softmax(a), log_softmax(b)
    return max(abs(x - y) for x, y in zip(la, lb))


def argmax_low(row):
    best = 0
    for i, v in enumerate(row):
        if v > row[best]:
            best = i
    return best


def compare(ref, other):
    """ref, other: fixture dicts of one prompt. Rows at common positions; steps while both decoded
    the same ids (steps[i] depends on greedy_ids[:i])."""
    if ref["prompt_ids"] != other["prompt_ids"]:
        raise ValueError(f"{ref.get('name')}: prompts differ")
    pos_b = {p: i for i, p in enumerate(other["row_pos"])}
    worst_rows = 0.0
    for i, p in enumerate(ref["row_pos"]):
        if p in pos_b:
            worst_rows = max(worst_rows, max_lp_diff(ref["rows"][i], other["rows"][pos_b[p]]))
    worst_steps, same_ids, compared = 0.0, 0, 0
    ga, gb = ref["greedy_ids"], other["greedy_ids"]
    for i in range(min(len(ref["steps"]), len(other["steps"]))):
        if ga[:i] != gb[:i]:
            break
        worst_steps = max(worst_steps, max_lp_diff(ref["steps"][i], other["steps"][i]))
        compared += 1
        same_ids += ga[i] == gb[i]
    return {"max_dlogprob_rows": worst_rows, "max_dlogprob_steps": worst_steps,
            "steps_compared": compared, "greedy_equal": same_ids, "greedy_total": len(ga)}


# ---------------------------------------------------------------------------------------------
# the reference, loaded from --ref
# ---------------------------------------------------------------------------------------------
def load_reference(ref_dir, device):
    import torch

    missing = [f for f in REF_FILES if not os.path.isfile(os.path.join(ref_dir, f))]
    if missing:
        raise SystemExit(f"{ref_dir}: missing reference file(s) {missing} (see bench/dsv41_device.sh --prep)")
    pkg_root = tempfile.mkdtemp(prefix="v41torch_")
    pkg = os.path.join(pkg_root, "dsv41_reference")
    os.makedirs(pkg)
    for f in REF_FILES:
        shutil.copy(os.path.join(ref_dir, f), pkg)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    for name, text in (("image_processor.py", PLACEHOLDER_IMAGE_PROCESSOR), ("vision.py", PLACEHOLDER_VISION)):
        if os.path.isfile(os.path.join(ref_dir, name)):
            shutil.copy(os.path.join(ref_dir, name), pkg)  # the real one, when carried
        else:
            with open(os.path.join(pkg, name), "w") as fh:
                fh.write(text)
    torch.set_default_device(device)  # before the import: kernel_cpu's tables are made there
    sys.path.insert(0, pkg_root)
    return importlib.import_module("dsv41_reference.model")


ST_DTYPES = {
    "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64",
    "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
}


def read_safetensors(path):
    """name -> CPU tensor, every dtype the checkpoints use (own reader: no dtype-support doubts)."""
    import torch

    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
        data = fh.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        dt = ST_DTYPES.get(meta["dtype"])
        if dt is None:
            raise SystemExit(f"{path}: {name}: dtype {meta['dtype']} not handled")
        raw = torch.frombuffer(bytearray(data[a:b]), dtype=torch.uint8) if b > a else torch.empty(0, dtype=torch.uint8)
        if dt == "bfloat16" and FP32["on"]:  # exact widening; the reference's parameters are fp32
            out[name] = raw.view(FP32["bf16"]).reshape(meta["shape"]).float()
        else:
            out[name] = raw.view(getattr(torch, dt)).reshape(meta["shape"])
    return out


def load_weights(mod, model, folder):
    import torch

    ck = {}
    with torch.device("cpu"):  # the checkpoint stays on the host; copy_ moves it
        for f in sorted(os.listdir(folder)):
            if f.endswith(".safetensors"):
                ck.update(read_safetensors(os.path.join(folder, f)))
    used = set()
    for name, p in model.named_parameters():
        if name not in ck:
            raise SystemExit(f"{folder}: parameter {name} not in the checkpoint")
        t = ck[name]
        used.add(name)
        if p.dtype == t.dtype or (p.dtype == torch.float4_e2m1fn_x2 and t.dtype in (torch.int8, torch.uint8)):
            if tuple(p.shape) != tuple(t.shape):
                raise SystemExit(f"{folder}: {name}: shape {tuple(t.shape)}, the reference has {tuple(p.shape)}")
            if p.element_size() == 1:
                p.data.view(torch.uint8).copy_(t.view(torch.uint8))
            else:
                p.data.copy_(t)
        elif t.dtype == torch.float8_e4m3fn and name.endswith(".weight") and name[:-7] + ".scale" in ck:
            # FP8 in the release, bf16/fp32 in the reference (attn.wo_a): as convert.py
            s = ck[name[:-7] + ".scale"].float()
            used.add(name[:-7] + ".scale")
            out_f, in_f = t.shape
            full = s.repeat_interleave(32, 0)[:out_f].repeat_interleave(32, 1)[:, :in_f]
            w = (t.float() * full).to(FP32["bf16"] or torch.bfloat16)  # rounded to bf16 as convert.py
            p.data.copy_(w.to(p.dtype))
        elif t.dtype in (torch.float32, torch.bfloat16, torch.float16) and p.dtype in (
            torch.float32, torch.bfloat16
        ):
            if tuple(p.shape) != tuple(t.shape):
                raise SystemExit(f"{folder}: {name}: shape {tuple(t.shape)}, the reference has {tuple(p.shape)}")
            p.data.copy_(t.to(p.dtype))
        else:
            raise SystemExit(f"{folder}: {name}: checkpoint dtype {t.dtype}, reference parameter {p.dtype}")
    left = sorted(k for k in ck if k not in used and not k.startswith("mtp."))
    if left:
        raise SystemExit(f"{folder}: checkpoint tensors the reference does not read: {left[:8]}")


class HFTokenizer:
    """What engram.build_compressed_token_map reads: len() and .backend_tokenizer."""

    def __init__(self, path):
        from tokenizers import Tokenizer

        self.backend_tokenizer = Tokenizer.from_file(path)

    def __len__(self):
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)


def build_model(mod, folder, max_seq_len, device):
    import dataclasses

    import torch

    with open(os.path.join(folder, "inference", "config.json")) as fh:
        cfg = json.load(fh)
    fields = {f.name for f in dataclasses.fields(mod.ModelArgs)}
    unknown = sorted(k for k in cfg if k not in fields)
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in cfg.items() if k in fields}
    kw.update(max_batch_size=1, max_seq_len=max_seq_len, temperature=0)
    args = mod.ModelArgs(**kw)
    torch.set_default_dtype(torch.bfloat16)  # float32 under --fp32
    tok_path = os.path.join(folder, "tokenizer.json")
    tok = HFTokenizer(tok_path) if args.engram_layer_ids else None
    token_map = "engram.py's, from the tokenizers package" if args.engram_layer_ids else None
    try:
        with torch.device(device):
            model = mod.Transformer(args, tok)
    except AssertionError as e:
        if not args.engram_layer_ids:
            raise
        # engram.py's own map disagreed with the config's engram_compressed_vocab_size (the
        # assertion in NgramHashState): say so, and go on with the NumPy oracle's map so the rest
        # of the forward is still compared
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import v41_ref

        engram = importlib.import_module(mod.__name__.rsplit(".", 1)[0] + ".engram")
        own = engram.build_compressed_token_map

        def oracle_map(_tok):
            lookup, n = v41_ref.build_compressed_token_map(v41_ref.Tokenizer(tok_path))
            return [int(v) for v in lookup], n

        engram.build_compressed_token_map = oracle_map
        try:
            with torch.device(device):
                model = mod.Transformer(args, tok)
        finally:
            engram.build_compressed_token_map = own
        token_map = f"the NumPy oracle's (engram.py's own failed its check: {e!r})"
        print(f"{folder}: compressed token map: {token_map}")
    load_weights(mod, model, folder)
    model.eval()
    # every prompt position's logits, not just the last one (ParallelHead's full_logits)
    head_forward = model.head.forward
    model.head.forward = lambda x, full_logits=False: head_forward(x, True)
    return model, args, unknown, token_map


def g8(v):
    return float(f"{v:.8g}")


def dump_hooks(model, store):
    """Forward hooks saving float32 copies of the prefill's intermediates into store (name -> array)."""
    hooks = []

    def save(name):
        def hook(_m, _inp, out):
            t = out[0] if isinstance(out, tuple) else out
            if name not in store:  # the prefill only (the first call)
                store[name] = t.detach().float().cpu().numpy()
        return hook

    hooks.append(model.embed.register_forward_hook(save("embed")))
    ref = sys.modules[type(model).__module__]

    def save_index(i):
        def hook(_m, _inp, out):  # the compressed picks (offset by the prefill's length) and the
            if f"L{i}.index" not in store:  # candidate mask a candidate source published
                store[f"L{i}.index"] = out.detach().cpu().numpy().astype("float32")
                cand = getattr(ref.shared_attn, "candidates", None)
                if getattr(_m, "is_candidate_source", False) and cand is not None:
                    store[f"L{i}.candidates"] = cand.detach().cpu().numpy().astype("float32")
        return hook

    for i, layer in enumerate(model.layers):
        if getattr(layer.attn, "indexer", None) is not None:
            hooks.append(layer.attn.indexer.register_forward_hook(save_index(i)))
        hooks.append(layer.attn.register_forward_hook(save(f"L{i}.attn")))
        hooks.append(layer.ffn.register_forward_hook(save(f"L{i}.ffn")))
        hooks.append(layer.register_forward_hook(save(f"L{i}.out")))
        if layer.engram is not None:
            hooks.append(layer.engram.register_forward_hook(save(f"L{i}.engram")))
    return hooks


def run_fixture(mod, mkmodel, fx_path, out_dir, device, dump=None):
    import torch

    with open(fx_path) as fh:
        fx = json.load(fh)
    prompt, n_steps = fx["prompt_ids"], len(fx["steps"])
    work = tempfile.mkdtemp(prefix="v41torch_m_")
    try:
        subprocess.run([mkmodel, "--out", work, *fx["mkmodel_args"]], check=True, stdout=subprocess.DEVNULL)
        max_seq = ((len(prompt) + n_steps + 63) // 64) * 64
        t0 = time.time()
        model, args, unknown, token_map = build_model(mod, work, max_seq, device)
        store = {}
        hooks = dump_hooks(model, store) if dump else []
        ids = torch.tensor([prompt], dtype=torch.long, device=device)
        _, logits, _ = model(ids, 0)
        for h in hooks:
            h.remove()
        if dump:
            import numpy as np

            store["logits"] = logits[0].float().cpu().numpy()
            os.makedirs(dump, exist_ok=True)
            np.savez_compressed(os.path.join(dump, fx["name"] + ".npz"), **store)
        logits = logits[0].float().cpu()
        rows = [[g8(v) for v in logits[p].tolist()] for p in fx["row_pos"]]
        steps, greedy = [logits[len(prompt) - 1].tolist()], []
        for st in range(n_steps):
            greedy.append(argmax_low(steps[st]))
            if st + 1 < n_steps:
                nxt = torch.tensor([[greedy[-1]]], dtype=torch.long, device=device)
                _, lg, _ = model(nxt, len(prompt) + st)
                steps.append(lg.reshape(-1).float().cpu().tolist())
        secs = time.time() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    margins = []
    for s in steps:
        top = sorted(s, reverse=True)[:2]
        margins.append(g8(top[0] - top[1]))
    out = {
        "name": fx["name"], "mkmodel_args": fx["mkmodel_args"], "prompt_ids": prompt,
        "row_pos": fx["row_pos"], "rows": rows, "greedy_ids": greedy,
        "steps": [[g8(v) for v in s] for s in steps], "step_margins": margins,
        "config": fx.get("config"),
        "oracle": "DeepSeek's inference/model.py + engram.py + kernel_cpu.py (torch port of kernel.py), "
                  "run by tests/oracles/v41_torch_ref.py; " + (
                      "float32 activations (--fp32: torch.bfloat16 aliased to float32)" if FP32["on"]
                      else "bf16 default dtype as generate.py"),
        "activations": "float32" if FP32["on"] else "bfloat16",
        "torch_version": torch.__version__, "device": device,
        "device_name": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
        "config_keys_not_in_ModelArgs": unknown, "engram_token_map": token_map,
    }
    out["vs_numpy_oracle"] = compare(fx, out)
    with open(os.path.join(out_dir, fx["name"] + ".json"), "w") as fh:
        json.dump(out, fh, separators=(",", ":"))
    c = out["vs_numpy_oracle"]
    print(f"{fx['name']}: torch reference ({device}{', fp32' if FP32['on'] else ''}, {secs:.1f} s) vs NumPy oracle: max |d logprob| "
          f"rows {c['max_dlogprob_rows']:.3g}, steps {c['max_dlogprob_steps']:.3g} "
          f"({c['steps_compared']} compared); greedy equal {c['greedy_equal']} of {c['greedy_total']}")
    return out


def selftest(mod, device):
    """The reference's act_quant / fp4_act_quant (bf16 in place) against the NumPy oracle's on the
    same bf16 values: every QDQ result is exact in bf16 (3 or 1 mantissa bits times a power of two or
    an e4m3 scale), so they must agree bit for bit. Prints one line; returns the count differing."""
    import numpy as np
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import v41_ref

    kern = importlib.import_module(mod.__name__.rsplit(".", 1)[0] + ".kernel_cpu")
    with torch.device("cpu"):  # the data on the host, whatever the default device
        g = torch.Generator(device="cpu").manual_seed(40)
        x = torch.randn(512, 64, generator=g) * torch.logspace(-6, 3, 512).unsqueeze(1)
        x[7] = 0.0  # an all-zero row: the amax clamps
        x[9] = torch.round(x[9] * 64) / 64  # values on a grid: exact ties
        xb = x.to(torch.bfloat16)
    xf = xb.float().numpy()
    bad = 0
    for name, fn, ref in (
        ("act_quant", lambda t: kern.act_quant(t, 32, "ue8m0", torch.float8_e8m0fnu, True),
         lambda a: v41_ref.act_quant(a, 32)),
        ("fp4_act_quant 32", lambda t: kern.fp4_act_quant(t, 32, True),
         lambda a: v41_ref.fp4_act_quant(a, 32)),
        ("fp4_act_quant 16 e4m3", lambda t: kern.fp4_act_quant(t, 16, True, scale_dtype=torch.float8_e4m3fn),
         lambda a: v41_ref.fp4_act_quant(a, 16, True)),
    ):
        got = fn(xb.clone().to(device)).float().cpu().numpy()
        want = ref(xf).astype(np.float32)
        n = int(np.sum(got.view(np.uint32) != want.view(np.uint32)))
        print(f"selftest {name} ({device}): reference kernel vs NumPy oracle: {n} of {got.size} differ")
        bad += n
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", help="folder with model.py, engram.py, kernel_cpu.py")
    ap.add_argument("--mkmodel")
    ap.add_argument("--fixture", action="append", default=[])
    ap.add_argument("--out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    ap.add_argument("--selftest", action="store_true", help="quantizers: reference vs NumPy oracle")
    ap.add_argument("--fp32", action="store_true", help="float32 activations (see the docstring)")
    ap.add_argument("--dump", help="save each fixture's prefill intermediates as DIR/<name>.npz")
    a = ap.parse_args()
    if a.compare:
        with open(a.compare[0]) as f1, open(a.compare[1]) as f2:
            print(json.dumps(compare(json.load(f1), json.load(f2))))
        return 0
    if a.selftest:
        if not a.ref:
            ap.error("--selftest needs --ref")
        return 1 if selftest(load_reference(a.ref, a.device), a.device) else 0
    if not (a.ref and a.mkmodel and a.fixture and a.out):
        ap.error("--ref, --mkmodel, --fixture and --out are needed (or --compare A B)")
    os.makedirs(a.out, exist_ok=True)
    if a.fp32:
        fp32_mode()
    mod = load_reference(a.ref, a.device)
    worst, failed = 0.0, []
    for fx in a.fixture:
        try:  # one fixture failing (a reference assert, a dtype torch lacks) must not stop the rest
            c = run_fixture(mod, a.mkmodel, fx, a.out, a.device, a.dump)["vs_numpy_oracle"]
        except Exception:  # noqa: BLE001 - reported, then the next fixture
            import traceback

            traceback.print_exc()
            print(f"{fx}: FAILED (traceback above)")
            failed.append(fx)
            continue
        worst = max(worst, c["max_dlogprob_rows"], c["max_dlogprob_steps"])
    print(f"torch reference vs NumPy oracle, {len(a.fixture) - len(failed)} of {len(a.fixture)} "
          f"fixtures: max |d logprob| {worst:.3g}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
