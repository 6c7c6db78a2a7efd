#!/usr/bin/env python3
"""tools/train_demo/train_demo.py - train tokenmill's demo model (models/demo-pystdlib/).

What it does, in order (every step seeded; file order sorted by path):
  1. collects the Python standard library's sources of the running interpreter (sysconfig's
     "stdlib" folder: *.py, plus small *.txt/*.rst files; site-packages, dist-packages and
     __pycache__ skipped; files that are not UTF-8 or over 512 kB skipped) and splits them by a
     hash of the relative path: ~2% "val" (picks the checkpoint), ~2% "test" (reported, and the
     source of the repository's fixtures), the rest "train";
  2. trains a byte-level BPE tokenizer on the train files with Hugging Face `tokenizers`, in the
     subset tokenmill's tokenizer reads exactly (docs/tokenizer.md): no normalizer, pre-tokenizer
     Sequence[Split(Llama 3 regex, Isolated), ByteLevel(add_prefix_space=False, use_regex=False)],
     ByteLevel decoder, special tokens <|bos|> (id 0) and <|eos|> (id 1); with --tokenmill BIN it
     checks token-for-token agreement of `BIN tokenize` with `tokenizers` on held-out text (and
     falls back to the GPT-2 regex if the Llama 3 one disagreed);
  3. trains a LlamaForCausalLM (transformers; GQA, tied embeddings, bf16 autocast, AdamW, cosine
     schedule) on random windows of the token stream (each file is <|bos|> text <|eos|>) for a
     fixed number of steps, or for --minutes (the step count is then fixed after 100 timed steps
     and printed, so `--steps N` repeats the schedule); the checkpoint with the lowest val loss
     wins;
  4. saves config.json, generation_config.json, model.safetensors (bf16), tokenizer.json and
     tokenizer_config.json into --out, checks the folder is <= 10 MB, and writes
     --out/training.json: the command, data sizes (files, bytes, tokens), parameter count, the
     losses (train/val/test, measured in fp32 on the saved bf16 weights), steps, tokens seen,
     wall time, versions.

Needs torch (CUDA), transformers (tested 5.17) and tokenizers (0.23); no network.
Usage:  python3 tools/train_demo/train_demo.py --out models/demo-pystdlib --minutes 4.5
        python3 tools/train_demo/train_demo.py --smoke --out /tmp/smoke   (a 20 s check)
"""
import argparse
import copy
import hashlib
import json
import math
import os
import subprocess
import sys
import sysconfig
import time

LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BOS, EOS = "<|bos|>", "<|eos|>"
MAX_FILE = 512 * 1024
SIZE_LIMIT = 10_000_000  # bytes, the whole output folder


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------
# 1. data


def collect(stdlib):
    """[(relpath, text)] of the usable files under stdlib, sorted by relpath; and skip counts."""
    out, skipped = [], {"not_utf8": 0, "too_big": 0, "nul": 0}
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs
                         if d not in ("site-packages", "dist-packages", "__pycache__"))
        for f in sorted(files):
            if not (f.endswith(".py") or f.endswith(".txt") or f.endswith(".rst")):
                continue
            path = os.path.join(root, f)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            size = os.path.getsize(path)
            if size > MAX_FILE or (not f.endswith(".py") and size > 200 * 1024):
                skipped["too_big"] += 1
                continue
            with open(path, "rb") as fh:
                raw = fh.read()
            if b"\0" in raw:
                skipped["nul"] += 1
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                skipped["not_utf8"] += 1
                continue
            if text.strip():
                out.append((os.path.relpath(path, stdlib), text))
    out.sort(key=lambda t: t[0])
    return out, skipped


def split_of(relpath):
    h = hashlib.sha256(relpath.encode()).digest()[0]
    return "test" if h < 5 else "val" if h < 10 else "train"


# ------------------------------------------------------------------------------------------------
# 2. tokenizer


def train_tokenizer(texts, vocab, pattern):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    # Plain prompts get <|bos|> first, as tokenmill's runner does (it ignores post_processor).
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))])
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1
    return tok


def save_tokenizer(tok, out, ctx):
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"), pretty=False)
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
           "add_bos_token": True, "add_eos_token": False, "model_max_length": ctx,
           "clean_up_tokenization_spaces": False}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def agreement_texts(docs):
    """Held-out strings for the tokenizer check: pieces of held-out files of varied lengths, and
    edge cases (non-ASCII, CRLF, tabs, digit runs, long runs, contractions, special tokens)."""
    texts = []
    for rel, text in docs:
        lines = text.split("\n")
        for start in range(0, min(len(lines), 120), 23):
            texts.append("\n".join(lines[start:start + 1 + (start % 17)]))
    texts += [
        "héllo wörld, naïve café", "日本語のテキストと中文混合", "emoji 🚀🔥 done", "\r\n\r\n  \t x",
        "12345678 3.14159 0x1F 1e-10", "it's they're we've I'm you'll he'd IT'S", "   leading",
        "trailing   ", "a" * 300, " " * 40 + "return x", "x = 1\n\n\n    return y\n", "\t\tif x:\n",
        "def f(*args, **kwargs) -> None: ...", "s = '''doc\nstring'''", f"{BOS}text{EOS}",
        "<|bos", "\u0085 \ufeff \u017f", "Ω≈ç√∫˜µ≤≥÷", "\u00a0\u2003\u3000", "!!!??? ...",
    ]
    return [t for t in texts if t]


def check_tokenmill(tok, tok_dir, tokenmill, texts, log_path):
    """Number of texts where `tokenmill tokenize` differs from tokenizers (None: no binary)."""
    if not tokenmill:
        return None
    ref = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    inp = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    r = subprocess.run([tokenmill, "tokenize", tok_dir], input=inp.encode(), capture_output=True)
    got = [json.loads(l)["ids"] for l in r.stdout.decode().splitlines() if l.strip()]
    bad = [i for i in range(len(texts)) if i >= len(got) or got[i] != ref[i]]
    with open(log_path, "w") as f:
        f.write(f"rc {r.returncode} stderr {r.stderr.decode()[:2000]!r}\n")
        for i in bad[:20]:
            f.write(json.dumps({"text": texts[i], "hf": ref[i],
                                "tm": got[i] if i < len(got) else None}) + "\n")
    if r.returncode != 0:
        return len(texts)
    return len(bad)


# ------------------------------------------------------------------------------------------------
# 3. model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ff", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=1024, help="training window = context length")
    ap.add_argument("--batch", type=int, default=32, help="windows per step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--steps", type=int, help="fixed step count (default: from --minutes)")
    ap.add_argument("--minutes", type=float, default=4.5, help="training time when no --steps")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--aux", help="folder for training.json, tok_agree.jsonl, test_snippet.txt "
                    "and the tokenizer check's log (default: --out's parent)")
    ap.add_argument("--tokenmill", help="tokenmill binary for the tokenizer agreement check")
    ap.add_argument("--smoke", action="store_true", help="tiny data/model/steps: a quick check")
    a = ap.parse_args()
    if a.smoke:
        a.vocab, a.layers, a.hidden, a.ff, a.ctx, a.batch = 512, 2, 64, 128, 128, 8
        a.steps, a.warmup, a.eval_every = 30, 5, 10
    a.aux = a.aux or os.path.dirname(os.path.abspath(a.out))
    t_start = time.time()

    import numpy as np
    import tokenizers
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.aux, exist_ok=True)

    # 1. data
    docs, skipped = collect(a.stdlib)
    parts = {"train": [], "val": [], "test": []}
    for rel, text in docs:
        parts[split_of(rel)].append((rel, text))
    if a.smoke:
        parts = {k: v[:150] if k == "train" else v[:10] for k, v in parts.items()}
    nbytes = {k: sum(len(t.encode()) for _, t in v) for k, v in parts.items()}
    log(f"stdlib {a.stdlib}: {len(docs)} files, skipped {skipped}; " +
        ", ".join(f"{k} {len(v)} files {nbytes[k]} bytes" for k, v in parts.items()))

    # 2. tokenizer
    t0 = time.time()
    train_texts = [t for _, t in parts["train"]]
    agree = agreement_texts(parts["val"] + parts["test"])
    pretok, n_bad = "llama3", None
    for pretok, pattern in (("llama3", LLAMA3_PAT), ("gpt2", None)):
        if pattern is None:
            pattern = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|"
                       r"\s+(?!\S)|\s+")
        tok = train_tokenizer(train_texts, a.vocab, pattern)
        save_tokenizer(tok, a.out, a.ctx)
        n_bad = check_tokenmill(tok, a.out, a.tokenmill, agree,
                                os.path.join(a.aux, f"tok_mismatch_{pretok}.log"))
        log(f"tokenizer ({pretok} regex) trained in {time.time() - t0:.1f}s: vocab "
            f"{tok.get_vocab_size()}; tokenmill agreement: "
            f"{'not checked' if n_bad is None else f'{len(agree) - n_bad}/{len(agree)} texts equal'}")
        if not n_bad:
            break
    with open(os.path.join(a.aux, "tok_agree.jsonl"), "w") as f:
        for t, e in zip(agree, tok.encode_batch(agree, add_special_tokens=False)):
            f.write(json.dumps({"text": t, "ids": e.ids}, ensure_ascii=False) + "\n")

    # A held-out file's opening (cut at a line end), for the repository's NLL and logits checks.
    snippet = next((t for _, t in parts["test"] if t.endswith("\n") and 3000 <= len(t)), parts["test"][0][1])
    snippet = snippet[:snippet.rfind("\n", 0, 2500) + 1] or snippet[:2500]
    with open(os.path.join(a.aux, "test_snippet.txt"), "w") as f:
        f.write(snippet)
    log(f"test snippet: {len(snippet)} chars from the test split")

    def stream(part):
        encs = tok.encode_batch([t for _, t in parts[part]], add_special_tokens=False)
        arr = []
        for e in encs:
            arr.append(np.array([0] + e.ids + [1], dtype=np.int32))
        return np.concatenate(arr)

    data = {k: stream(k) for k in parts}
    ntok = {k: int(v.size) for k, v in data.items()}
    log(f"tokens: {ntok} ({nbytes['train'] / max(1, ntok['train']):.2f} bytes/token on train), "
        f"{time.time() - t0:.1f}s")
    gpu = {k: torch.from_numpy(v.astype(np.int64)).to(dev) for k, v in data.items()}

    # 3. model
    shape = dict(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ff,
                 num_hidden_layers=a.layers, num_attention_heads=a.heads,
                 num_key_value_heads=a.kv_heads, head_dim=a.hidden // a.heads, hidden_act="silu",
                 max_position_embeddings=a.ctx, rms_norm_eps=1e-5, bos_token_id=0,
                 eos_token_id=1, tie_word_embeddings=True, attention_bias=False, mlp_bias=False)
    try:  # transformers 5 spells RoPE this way; older ones take rope_theta
        cfg = LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **shape)
    except Exception as e:  # noqa: BLE001 - any refusal: try the old spelling
        log(f"LlamaConfig(rope_parameters=...) failed ({e}); using rope_theta")
        cfg = LlamaConfig(rope_theta=10000.0, **shape)
    model = LlamaForCausalLM(cfg).to(dev)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())  # tied: embed counted once
    log(f"model: {n_params} parameters, attn {getattr(model.config, '_attn_implementation', '?')}, {dev}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=(dev == "cuda"))
    gen = torch.Generator().manual_seed(a.seed)
    seq = a.ctx
    ar = torch.arange(seq + 1, device=dev)

    def batch_of(part, starts):
        idx = starts.to(dev)[:, None] + ar[None, :]
        w = gpu[part][idx]
        return w[:, :-1], w[:, 1:]

    def fixed_starts(part, n):
        total = gpu[part].numel() - seq - 1
        n = min(n, max(1, total // seq))
        return torch.arange(n, dtype=torch.int64) * (total // n)

    def loss_of(m, x, y, autocast=True):
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16,
                            enabled=autocast and dev == "cuda"):
            logits = m(input_ids=x, use_cache=False).logits
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))

    @torch.no_grad()
    def evaluate(m, part, n, autocast=True, bs=16):
        m.eval()
        starts = fixed_starts(part, n)
        tot, cnt = 0.0, 0
        for i in range(0, len(starts), bs):
            x, y = batch_of(part, starts[i:i + bs])
            tot += float(loss_of(m, x, y, autocast)) * y.numel()
            cnt += y.numel()
        m.train()
        return tot / cnt

    def lr_at(step, total):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        p = min(1.0, (step - a.warmup) / max(1, total - a.warmup))
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    total = a.steps if a.steps else 10**9
    budget = a.minutes * 60
    init_val = evaluate(model, "val", 32)
    log(f"step 0: val loss {init_val:.4f} (ln V = {math.log(a.vocab):.4f})")
    best = (init_val, 0, copy.deepcopy({k: v.detach().cpu() for k, v in model.state_dict().items()}))
    hist = []
    t_train = time.time()
    step, seen = 0, 0
    losses = []
    while step < total:
        if step == 20:
            if dev == "cuda":
                torch.cuda.synchronize()
            t20 = time.time()
        if step == 100 and not a.steps:
            if dev == "cuda":
                torch.cuda.synchronize()
            dt = (time.time() - t20) / 80
            total = 100 + int((budget - (time.time() - t_train)) / (dt * 1.03))
            log(f"{dt * 1000:.1f} ms/step over steps 20-100: {total} steps in all "
                f"(--steps {total} repeats this schedule)")
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total)
        starts = torch.randint(0, gpu["train"].numel() - seq - 1, (a.batch,), generator=gen)
        x, y = batch_of("train", starts)
        loss = loss_of(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += y.numel()
        losses.append(loss.detach())
        if step % a.eval_every == 0 or step == total:
            tl = float(torch.stack(losses).mean())
            losses = []
            vl = evaluate(model, "val", 32)
            hist.append({"step": step, "train": round(tl, 4), "val": round(vl, 4),
                         "s": round(time.time() - t_train, 1)})
            log(f"step {step}/{total}: train {tl:.4f} val {vl:.4f} lr {lr_at(step, total):.2e} "
                f"{seen / (time.time() - t_train) / 1e6:.2f} M tok/s")
            if vl < best[0]:
                best = (vl, step, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()})
    train_s = time.time() - t_train
    log(f"trained {step} steps, {seen} tokens in {train_s:.1f}s; best val {best[0]:.4f} "
        f"at step {best[1]}")

    # 4. save (bf16) and measure the saved weights in fp32, as tokenmill's CPU engine runs them
    model.load_state_dict(best[2])
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1, do_sample=False)
    model.save_pretrained(a.out)
    m32 = model.to(torch.float32)
    losses_final = {k: evaluate(m32, k, 64 if k == "train" else 256, autocast=False)
                    for k in ("train", "val", "test")}
    files = sorted(os.listdir(a.out))
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in files)
    rec = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "seed": a.seed, "stdlib": a.stdlib, "python": sys.version.split()[0],
        "files": {k: len(v) for k, v in parts.items()}, "skipped": skipped,
        "bytes": nbytes, "tokens": ntok, "pretokenizer": pretok,
        "tokenmill_tokenizer_agreement": None if n_bad is None else
        {"texts": len(agree), "equal": len(agree) - n_bad},
        "parameters": n_params,
        "shape": {"layers": a.layers, "hidden": a.hidden, "heads": a.heads,
                  "kv_heads": a.kv_heads, "ff": a.ff, "vocab": a.vocab, "ctx": a.ctx},
        "batch_windows": a.batch, "lr": a.lr, "warmup": a.warmup, "steps": step,
        "best_step": best[1], "tokens_seen": seen, "train_seconds": round(train_s, 1),
        "wall_seconds": round(time.time() - t_start, 1),
        "loss_init_val": round(init_val, 4),
        "loss_fp32_on_bf16": {k: round(v, 4) for k, v in losses_final.items()},
        "history": hist, "folder_bytes": size, "folder_files": files,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
        "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
    }
    with open(os.path.join(a.aux, "training.json"), "w") as f:
        json.dump(rec, f, indent=1)
        f.write("\n")
    log(f"saved {a.out}: {files}, {size} bytes; losses {rec['loss_fp32_on_bf16']}")
    if size > SIZE_LIMIT:
        sys.exit(f"train_demo: {a.out} is {size} bytes, over {SIZE_LIMIT}")


if __name__ == "__main__":
    main()
