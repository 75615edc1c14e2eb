#!/usr/bin/env python3
"""Branch ÷ main per run (paired medians of the repetitions, and range),
and each build ÷ ext4-disk (ratio of medians), for the runs given; in the
swapped runs (names ending in 2, 4 or 6) main's build is in the plain slot.
Usage: summary.py RUN..."""
import json, os, statistics, sys
here = os.path.dirname(os.path.abspath(__file__))
for run in sys.argv[1:]:
    p = os.path.join(here, run, "results.json")
    if not os.path.exists(p):
        continue
    d = json.load(open(p))
    swapped = run[-1] in "246"
    new, old = ("base.inkfs-hybrid-posix", "inkfs-hybrid-posix") if swapped else ("inkfs-hybrid-posix", "base.inkfs-hybrid-posix")
    for w in d["workloads"].values():
        for case, cs in w["cases"].items():
            if new not in cs or old not in cs:
                continue
            vn, vo, ve = cs[new]["values"], cs[old]["values"], cs.get("ext4-disk", {}).get("values", [])
            r = [a / b for a, b in zip(vn, vo) if b]
            if not r:
                continue
            med = statistics.median
            ext = f"; branch {med(vn) / med(ve):.2f}x, main {med(vo) / med(ve):.2f}x ext4-disk" if ve else ""
            print(f"{run}{' (swapped)' if swapped else ''} {case}: branch/main {med(r):.2f}x "
                  f"[{min(r):.2f}-{max(r):.2f}]{ext}")
