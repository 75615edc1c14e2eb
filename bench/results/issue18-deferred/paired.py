#!/usr/bin/env python3
"""Paired ratios of a bench/run results.json: per repetition, A's value over
B's (both higher-is-better here), then the median and range of the ratios.
Usage: paired.py RESULTS.json A B"""
import json, statistics, sys
d = json.load(open(sys.argv[1])); a, b = sys.argv[2], sys.argv[3]
for wname, w in d["workloads"].items():
    for case, cs in w["cases"].items():
        if a not in cs or b not in cs:
            continue
        va, vb = cs[a]["values"], cs[b]["values"]
        r = [x / y for x, y in zip(va, vb) if y]
        if not r:
            continue
        print(f"{wname}:{case}: {a} / {b} paired median {statistics.median(r):.2f}x "
              f"[{min(r):.2f}-{max(r):.2f}] over {len(r)} reps; medians {cs[a]['median']:.0f} / {cs[b]['median']:.0f}")
