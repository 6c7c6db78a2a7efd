#!/usr/bin/env python3
# bench/job_metrics.py METRICS.json [LABEL] - the figures of a `tokenmill run` job that the
# job-vs-bench scripts (job_vs_bench.sh, dsv4_job_vs_bench.sh, dsv41_cuda_job.sh) compare with
# bench_engine: the decode rate with its tokens, time and steps, prefill and output rates, tpot,
# then the token and record counts. Keys are found wherever metrics.json nests them.
import json
import sys


def find(o, k):
    if isinstance(o, dict):
        for kk, v in o.items():
            if kk == k:
                return v
            r = find(v, k)
            if r is not None:
                return r
    return None


m = json.load(open(sys.argv[1]))
label = sys.argv[2] if len(sys.argv) > 2 else "job"
e = find(m, "engine") or {}
tpot = find(m, "tpot") or {}
print("%s: decode %.1f tok/s (%s tokens in %.3f s over %s steps), prefill %.1f tok/s, output %.1f "
      "tok/s, tpot p50 %s ms"
      % (label, find(m, "decode_tok_s") or 0, e.get("decode_tokens"), e.get("decode_s") or 0,
         e.get("steps"), find(m, "prefill_tok_s") or 0, find(m, "output_tok_s") or 0,
         "%.3f" % tpot["p50"] if isinstance(tpot, dict) and tpot.get("p50") is not None else "-"))
print("%s: tokens %s, records %s" % (label, json.dumps(m.get("tokens")), json.dumps(m.get("records"))))
