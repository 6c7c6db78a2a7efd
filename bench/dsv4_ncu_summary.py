#!/usr/bin/env python3
# bench/dsv4_ncu_summary.py - the last decode step of an ncu --csv run of bench_engine --shape
# dsv4-flash (eager steps, TM_DSV4_NO_GRAPHS=1, --gen 2): the kernels from the last embed launch
# on, their count and time, the top kernels by time. Usage: dsv4_ncu_summary.py ncu.csv [layers]
import csv, sys, collections
rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    ns = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    ns *= {"ns": 1, "nsecond": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}.get(unit, 1)
    rows.append((r["Kernel Name"], r.get("Grid Size", ""), r.get("Block Size", ""), ns))
last = max(i for i, r in enumerate(rows) if "embed" in r[0])
step = rows[last:]
L = int(sys.argv[2]) if len(sys.argv) > 2 else 1
tot = sum(r[3] for r in step)
print("decode step: %d kernels (%.1f per layer over %d layers), %.1f us of kernel time (%.1f per layer)"
      % (len(step), len(step) / L, L, tot / 1e3, tot / 1e3 / L))
agg = collections.OrderedDict()
for n, g, b, ns in step:
    k = n[:60]
    a = agg.setdefault(k, [0, 0.0, g, b])
    a[0] += 1
    a[1] += ns
for k, (c, ns, g, b) in sorted(agg.items(), key=lambda x: -x[1][1])[:25]:
    print("  %-60s %4d x %8.1f us = %8.1f us %5.1f%%  grid %s block %s" % (k, c, ns / c / 1e3, ns / 1e3, 100 * ns / tot, g, b))
print("in order:")
for n, g, b, ns in step:
    print("  %-60s %8.1f us grid %s" % (n[:60], ns / 1e3, g))
