#!/usr/bin/env python3
"""Exit give-back A/B: a preloaded python process creates N files in a
fresh directory and exits (holding the directory's lease and lane); at
once a process without the library stats one of the names (the kernel's
LOOKUP of D). Times: the creating process's wall time (its exit included),
the next process's stat, and both. usage: askon-exit.py MNT NEWLIB BASELIB ROUNDS"""
import os, subprocess, sys, time, statistics as st
mnt, new, base, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
N = 200
prog = "import os,sys\nd=sys.argv[1]\nfor i in range(%d):\n fd=os.open(f'{d}/f{i}',os.O_CREAT|os.O_WRONLY,0o644); os.write(fd,b'x'); os.close(fd)\n" % N
env0 = {k: v for k, v in os.environ.items() if k != 'LD_PRELOAD'}
res = {'new': [], 'base': []}
for r in range(rounds):
    order = [('new', new), ('base', base)] if r % 2 == 0 else [('base', base), ('new', new)]
    for name, lib in order:
        d = f"{mnt}/{name}{r}"
        os.mkdir(d)
        env = dict(env0, LD_PRELOAD=lib, INKFS_PRELOAD_DIR_LEASE='1')
        t0 = time.perf_counter()
        subprocess.run([sys.executable, '-c', prog, d], env=env, check=True)
        t1 = time.perf_counter()
        subprocess.run(['stat', '-c', '%s', f'{d}/f{N//2}'], env=env0, check=True, stdout=subprocess.DEVNULL)
        t2 = time.perf_counter()
        res[name].append((t1 - t0, t2 - t1, t2 - t0))
for name in res:
    v = res[name]
    print(name, 'creator %.2f ms' % (1e3 * st.median(x[0] for x in v)),
          'next stat %.2f ms' % (1e3 * st.median(x[1] for x in v)),
          'both %.2f ms' % (1e3 * st.median(x[2] for x in v)))
n, b = res['new'], res['base']
for i, what in enumerate(['creator', 'next stat', 'both']):
    print(f"{what}: new/base {st.median(x[i] for x in n) / st.median(x[i] for x in b):.3f}")
