#!/usr/bin/env python3
# Interleaved untar timing: main's build (posix) vs this branch (posix,noxattr).
# Each round: both variants, order swapped every round; fresh pool and mount each time.
import subprocess, time, statistics, os, sys
V = {"base": ("/tmp/stop33-base-release/inkfs", "mode=posix"),
     "noxattr": ("/tmp/kopen-new/inkfs", "mode=posix,noxattr")}
P, M, T = "/dev/shm/kopen-u.pool", "/tmp/kopen-um", "/tmp/kopen-big.tar"
os.makedirs(M, exist_ok=True)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
res = {k: [] for k in V}
def once(k):
    b, o = V[k]
    subprocess.run(["rm", "-f", P]); subprocess.run([b, "mkfs", P, "--size", "1G"], check=True, capture_output=True)
    subprocess.run([b, "mount", P, M, "-o", o], check=True)
    try:
        t = time.perf_counter(); subprocess.run(["tar", "xf", T, "-C", M], check=True); dt = time.perf_counter() - t
    finally:
        subprocess.run(["fusermount3", "-u", M], check=True); os.remove(P)
    return dt
print("load at start:", open("/proc/loadavg").read().strip())
for r in range(rounds):
    order = ["base", "noxattr"] if r % 2 == 0 else ["noxattr", "base"]
    for k in order:
        res[k].append(once(k))
    print(r, {k: round(v[-1], 3) for k, v in res.items()}, "ratio base/noxattr %.3f" % (res["base"][-1] / res["noxattr"][-1]), flush=True)
print("load at end:", open("/proc/loadavg").read().strip())
for k, v in res.items():
    print(k, "median %.3f s, min %.3f, max %.3f" % (statistics.median(v), min(v), max(v)))
rat = [a / b for a, b in zip(res["base"], res["noxattr"])]
print("per-round speed-up of noxattr (base time / noxattr time): median %.3f, min %.3f, max %.3f" % (statistics.median(rat), min(rat), max(rat)))
