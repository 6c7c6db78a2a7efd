#!/usr/bin/env python3
"""tests/oracles/hf/make_demo_fixture.py - transformers' answers for the trained demo model.

Loads the model folder with transformers (AutoModelForCausalLM, fp32 compute on the stored bf16
weights, eager attention, CPU) and the tokenizer with Hugging Face `tokenizers`, and writes:

  FIXTURES/hf/demo_pystdlib_bf16.json   the test_engine fixture (tests/unit/test_engine.c):
      {name, model_dir (relative to the repository), model_sha256, prompt_ids, greedy_ids,
       logits: [[n_vocab floats] * N_STEPS], model_type, transformers_version, torch_version}
      prompt_ids = <|bos|> + the first PROMPT_LEN ids of the held-out snippet; logits[0] is the
      prompt's last row, logits[i] the row after greedy_ids[i-1]; 7 significant digits.
  FIXTURES/demo_model/reference.json    for tests/e2e/e2e_demo_model.sh:
      heldout: {text, ids (with <|bos|>), logprob_sum, n_scored, mean_nll} - the held-out
        snippet scored token by token (what tokenmill's prompt_logprobs return);
      greedy: [{prompt, prompt_ids, ids, text, margins}] - GREEDY_STEPS greedy tokens per demo
        prompt (prompt_ids with <|bos|>, as tokenmill's runner adds it), margins = top-1 minus
        top-2 logit at each step;
      stdlib_modules: sys.stdlib_module_names of this interpreter; model_sha256.
  FIXTURES/demo_model/tok_agree.jsonl   copied from --tok-agree when given.

Usage (from the repository root, on a machine with torch + transformers + tokenizers):
  python3 tests/oracles/hf/make_demo_fixture.py --model models/demo-pystdlib \
      --snippet SNIPPET.txt [--tok-agree tok_agree.jsonl] [--fixtures tests/fixtures]
"""
import argparse
import hashlib
import json
import os
import shutil
import sys

PROMPT_LEN = 40
N_STEPS = 8
GREEDY_STEPS = 32
PROMPTS = ["def fibonacci(n):", "import os\n\ndef ", "class Stack:", "import ",
           "from collections import ", "def is_prime(n):\n    ", "    def __init__(self",
           "for i in range(10):\n    ", "with open(path) as f:\n    ", "# Copyright"]


def fmt(x):
    return float(f"{x:.7g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--model-dir-name", default="models/demo-pystdlib",
                    help="the folder's path in the repository, written into the fixture")
    ap.add_argument("--snippet", required=True, help="held-out text (train_demo's test_snippet.txt)")
    ap.add_argument("--tok-agree", help="train_demo's tok_agree.jsonl, copied into the fixtures")
    ap.add_argument("--fixtures", default="tests/fixtures")
    a = ap.parse_args()

    import torch
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    kw = dict(attn_implementation="eager", local_files_only=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, **kw)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32, **kw)
    model.eval()
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    bos = tok.token_to_id("<|bos|>")
    with open(os.path.join(a.model, "model.safetensors"), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    with open(a.snippet) as f:
        snippet = f.read()

    def logits_of(ids):
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()

    # test_engine fixture
    ids = [bos] + tok.encode(snippet, add_special_tokens=False).ids[:PROMPT_LEN - 1]
    prompt = list(ids)
    greedy, rows = [], []
    for _ in range(N_STEPS):
        row = logits_of(ids)[-1]
        t = int(torch.argmax(row).item())
        rows.append([fmt(v) for v in row.tolist()])
        greedy.append(t)
        ids.append(t)
    cfg = model.config
    fx = {"name": "demo_pystdlib_bf16", "model_dir": a.model_dir_name, "model_sha256": sha,
          "prompt_ids": prompt, "greedy_ids": greedy, "logits": rows,
          "model_type": cfg.model_type, "transformers_version": transformers.__version__,
          "torch_version": torch.__version__}
    os.makedirs(os.path.join(a.fixtures, "hf"), exist_ok=True)
    path = os.path.join(a.fixtures, "hf", "demo_pystdlib_bf16.json")
    with open(path, "w") as f:
        json.dump(fx, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}: greedy {greedy}")

    # held-out score
    hids = [bos] + tok.encode(snippet, add_special_tokens=False).ids
    hids = hids[:cfg.max_position_embeddings]
    lp = torch.log_softmax(logits_of(hids).double(), dim=-1)
    tok_lp = lp[torch.arange(len(hids) - 1), torch.tensor(hids[1:])]
    s = float(tok_lp.sum())
    text = snippet if len(hids) == len(tok.encode(snippet, add_special_tokens=False).ids) + 1 \
        else tok.decode(hids[1:], skip_special_tokens=False)
    heldout = {"text": text, "ids": hids,
               "logprob_sum": s, "n_scored": len(hids) - 1, "mean_nll": -s / (len(hids) - 1)}
    print(f"held-out snippet: {len(hids)} ids, mean NLL {heldout['mean_nll']:.4f}")

    # greedy continuations of the demo prompts
    greedy_ref = []
    for p in PROMPTS:
        pids = [bos] + tok.encode(p, add_special_tokens=False).ids
        ids, gen, margins = list(pids), [], []
        for _ in range(GREEDY_STEPS):
            row = logits_of(ids)[-1]
            top = torch.topk(row, 2)
            t = int(torch.argmax(row).item())
            gen.append(t)
            margins.append(fmt(float(top.values[0] - top.values[1])))
            ids.append(t)
        text = tok.decode(gen, skip_special_tokens=False)
        greedy_ref.append({"prompt": p, "prompt_ids": pids, "ids": gen, "text": text,
                           "margins": margins})
        print(f"greedy {p!r} -> {text!r}")
    ref = {"model_sha256": sha, "heldout": heldout, "greedy": greedy_ref,
           "stdlib_modules": sorted(sys.stdlib_module_names),
           "python": sys.version.split()[0], "transformers_version": transformers.__version__,
           "torch_version": torch.__version__}
    os.makedirs(os.path.join(a.fixtures, "demo_model"), exist_ok=True)
    path = os.path.join(a.fixtures, "demo_model", "reference.json")
    with open(path, "w") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {path}")
    if a.tok_agree:
        shutil.copyfile(a.tok_agree, os.path.join(a.fixtures, "demo_model", "tok_agree.jsonl"))


if __name__ == "__main__":
    main()
