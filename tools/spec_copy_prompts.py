#!/usr/bin/env python3
"""tools/spec_copy_prompts.py N OUT - copy-heavy prompts for speculative decoding tests and
benches (issue 25): N functions of the Python standard library that this interpreter ships
(the demo model's domain, docs/demo_model.md), each given whole, then started again, so that the
continuation repeats it. Deterministic: files and functions in sorted order, 300..1200 bytes."""
import ast, json, os, sys, sysconfig

n, out = int(sys.argv[1]), sys.argv[2]
lib = sysconfig.get_paths()["stdlib"]
names = ["textwrap.py", "shlex.py", "fnmatch.py", "heapq.py", "bisect.py", "glob.py",
         "string.py", "colorsys.py", "keyword.py", "queue.py", "sched.py", "calendar.py",
         "base64.py", "filecmp.py", "netrc.py", "tabnanny.py", "wave.py", "uu.py"]
recs = []
for name in names:
    path = os.path.join(lib, name)
    if not os.path.exists(path):
        continue
    src = open(path, encoding="utf-8").read()
    lines = src.split("\n")
    for node in ast.parse(src).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        body = "\n".join(lines[node.lineno - 1:node.end_lineno])
        if not 300 <= len(body) <= 1200:
            continue
        first = body.split("\n")[0]
        prompt = body + "\n\n\n# The same function again:\n" + first + "\n"
        recs.append({"id": f"{name[:-3]}.{node.name}", "prompt": prompt})
        break
    if len(recs) == n:
        break
with open(out, "w") as f:
    for r in recs:
        f.write(json.dumps(r) + "\n")
print(len(recs), "records")
