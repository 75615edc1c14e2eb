#!/usr/bin/env python3
"""Ratio tables from bench/run results.json files: per row, each contender's
median against ext4 (or the named reference), and new ÷ base (ratio of medians).
usage: ratios31.py DIR... [--ref ext4]"""
import json, sys, statistics as st
args=[a for a in sys.argv[1:] if not a.startswith('--')]
ref='ext4'
if '--ref' in sys.argv: ref=sys.argv[sys.argv.index('--ref')+1]
for d in args:
    r=json.load(open(d+'/results.json'))
    swapped='swapped' in d
    print(f"## {d} ({r['meta']['date']})")
    for wname,w in r['workloads'].items():
        hib=w.get('higher_is_better',True)
        for case,cs in w['cases'].items():
            med={c:st.median(v['values']) for c,v in cs.items() if v.get('values')}
            if not med: continue
            base_ref = med.get(ref) or med.get('ext4-disk') or med.get('ext4')
            out=[]
            for c,m in med.items():
                if c in ('ext4','ext4-disk') and base_ref==m: continue
                rr = (m/base_ref if hib else base_ref/m) if base_ref else float('nan')
                out.append(f"{c} {rr:.2f}x")
            news=[c for c in med if not c.startswith('base.') and ('base.'+c) in med]
            for c in news:
                n,b=med[c],med['base.'+c]
                if swapped: n,b=b,n
                rr = n/b if hib else b/n
                out.append(f"[{c}: new/base {rr:.2f}]")
            print(f"  {wname}:{case}: "+", ".join(out))
