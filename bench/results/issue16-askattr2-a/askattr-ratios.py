import json, sys, os
# usage: askattr-ratios.py TAG  -> per run: new+ask vs main+ask, new+ask vs new ask-off, main+ask vs main off (speed-up = time ratio)
tag=sys.argv[1]
runs=[('a',False),('b-swapped',True),('c',False),('d-swapped',True)]
print("| run | load (start/end) | case | ext4 | new+ask | main+ask | new off | main off | new+ask ÷ main+ask | new+ask ÷ new off | new+ask ÷ main off |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r,sw in runs:
    p=f'bench/results/{tag}-{r}/results.json'
    if not os.path.exists(p): continue
    d=json.load(open(p))
    load=d['meta'].get('load', d['meta'].get('loadavg',''))
    md=open(f'bench/results/{tag}-{r}/results.md').read()
    import re
    mm=re.search(r'at start / end: ([\d. ]+) / ([\d. ]+)',md)
    ld=f"{mm.group(1).split()[0]}/{mm.group(2).split()[0]}" if mm else "?"
    for case,cd in d['workloads']['meta']['cases'].items():
        med=lambda k: cd[k]['median']
        if sw:
            na,ma,no,mo=med('base.inkfs-preload+ask'),med('inkfs-preload+ask'),med('base.inkfs-preload'),med('inkfs-preload')
        else:
            na,ma,no,mo=med('inkfs-preload+ask'),med('base.inkfs-preload+ask'),med('inkfs-preload'),med('base.inkfs-preload')
        print(f"| {r} | {ld} | {case} | {med('ext4'):.2f} | {na:.2f} | {ma:.2f} | {no:.2f} | {mo:.2f} | {ma/na:.2f}× | {no/na:.2f}× | {mo/na:.2f}× |")
