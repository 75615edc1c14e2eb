#!/usr/bin/env python3
"""Medians and paired ratios of the A/B runs (reps.txt: the reads/s of each
repetition, from the run logs). In A and C this branch's build is
`inkfs-hybrid` and main's `base.inkfs-hybrid`; in B and D the slots are
swapped."""
import os
import sys
import statistics as st
runs, cur = {}, None
for l in open(os.path.join(os.path.dirname(os.path.abspath(__file__)), sys.argv[1] if len(sys.argv) > 1 else "reps.txt")):
    l = l.strip()
    if l.startswith("=="):
        cur = l[3:]
        runs[cur] = {}
    elif l:
        n, v = l.split()
        runs[cur].setdefault(n, []).append(float(v))
for r, d in runs.items():
    mine, main = ("inkfs-hybrid", "base.inkfs-hybrid") if r in ("A", "C", "WA", "WC") else ("base.inkfs-hybrid", "inkfs-hybrid")
    m = {k: st.median(v) for k, v in d.items()}
    paired = [a / b for a, b in zip(d[mine], d[main])]
    pn = [a / b for a, b in zip(d[main], d["null-fs"])]
    print(r, "branch", [round(x) for x in d[mine]], "main", [round(x) for x in d[main]],
          "ext4-disk", [round(x) for x in d["ext4-disk"]], "null-fs", [round(x) for x in d["null-fs"]])
    print(r, "branch/ext4 %.2f main/ext4 %.2f null/ext4 %.2f branch/null %.2f main/null %.2f branch/main %.2f "
          "paired %.2f [%.2f-%.2f] main/null paired %.2f [%.2f-%.2f]" % (
              m[mine] / m["ext4-disk"], m[main] / m["ext4-disk"], m["null-fs"] / m["ext4-disk"],
              m[mine] / m["null-fs"], m[main] / m["null-fs"], m[mine] / m[main],
              st.median(paired), min(paired), max(paired), st.median(pn), min(pn), max(pn)))
