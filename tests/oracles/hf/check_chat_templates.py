#!/usr/bin/env python3
"""tests/oracles/hf/check_chat_templates.py FIXTURE_DIR OUT.jsonl - render every case of
tests/fixtures/chat_templates/expected.jsonl with Hugging Face transformers' own chat-template
compiler (the one apply_chat_template uses: jinja2 sandbox, trim_blocks, lstrip_blocks,
raise_exception) and compare with the stored renderings (made by @huggingface/jinja under node).
Run on the GPU machine, where transformers is installed. Writes each transformers rendering to
OUT.jsonl and prints the mismatches; exit 1 if any."""
import json
import os
import sys

import transformers
from transformers.utils import chat_template_utils as ctu

fixtures, out_path = sys.argv[1], sys.argv[2]
templates = {}
for f in sorted(os.listdir(fixtures)):
    if f.endswith(".json"):
        t = json.load(open(os.path.join(fixtures, f)))
        templates[t["name"]] = t
n = bad = 0
with open(out_path, "w") as out:
    for line in open(os.path.join(fixtures, "expected.jsonl")):
        case = json.loads(line)
        t = templates[case["template"]]
        row = {k: case[k] for k in ("template", "messages", "add_generation_prompt")}
        try:
            compiled = ctu._compile_jinja_template(t["chat_template"])
            row["rendered"] = compiled.render(messages=case["messages"],
                                              add_generation_prompt=case["add_generation_prompt"],
                                              bos_token=t.get("bos_token", ""),
                                              eos_token=t.get("eos_token", ""))
        except Exception as e:  # raise_exception in the template, or a template error
            row["error"] = str(e)
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
        n += 1
        same = ("error" in row) == ("error" in case) and row.get("rendered") == case.get("rendered")
        if not same:
            bad += 1
            print("MISMATCH", case["template"], json.dumps(case["messages"])[:120],
                  case["add_generation_prompt"], "\n  node:", json.dumps(case.get("rendered", case.get("error")))[:300],
                  "\n  hf:  ", json.dumps(row.get("rendered", row.get("error")))[:300])
print(f"transformers {transformers.__version__}: {n} cases, {bad} differ from the stored renderings")
sys.exit(1 if bad else 0)
