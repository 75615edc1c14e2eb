#!/usr/bin/env python3
# Interleaved untar of the meta tree under the library: this build's mount and library
# against main's, the ask on and off, ROUNDS rounds, the order rotated each round.
# (a copy of issue16-askattr-untarloop/askattr-untar-loop.py)
# usage: askmkdir-untar-loop.py ROUNDS NEWMNT NEWLIB MAINMNT MAINLIB TAR
import os, subprocess, sys, time, statistics, itertools
rounds=int(sys.argv[1]); nm,nl,mm,ml,tar=sys.argv[2:7]
cfgs=[("new+ask",nm,nl,"1"),("main+ask",mm,ml,"1"),("new off",nm,nl,"0"),("main off",mm,ml,"0")]
t={c[0]:[] for c in cfgs}
print("load", open('/proc/loadavg').read().split()[:3], flush=True)
for r in range(rounds):
    order=cfgs[r%4:]+cfgs[:r%4]
    for name,mnt,lib,ask in order:
        d=os.path.join(mnt,f"{os.getpid()}-r{r}-{name.replace(' ','').replace('+','')}")
        os.mkdir(d)
        env=dict(os.environ,LD_PRELOAD=lib,INKFS_PRELOAD_DIR_LEASE=ask)
        s=time.monotonic(); subprocess.run(["tar","-xf",tar,"-C",d],env=env,check=True); t[name].append(time.monotonic()-s)
print("load", open('/proc/loadavg').read().split()[:3])
for k,v in t.items(): print(f"{k}: median {statistics.median(v)*1000:.0f} ms  (min {min(v)*1000:.0f}, max {max(v)*1000:.0f}, n {len(v)})")
b=t["new+ask"]
for k in ("main+ask","new off","main off"):
    rs=[x/y for x,y in zip(t[k],b)]
    print(f"{k} ÷ new+ask per round: median {statistics.median(rs):.2f}x, range {min(rs):.2f}-{max(rs):.2f}")
