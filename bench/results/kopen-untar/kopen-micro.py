#!/usr/bin/env python3
# Interleaved: create+write+fchown+close of N files (tar's pattern), main's build (posix) vs noxattr.
import subprocess, time, statistics, os, sys
V = {"base": ("/tmp/stop33-base-release/inkfs", "mode=posix"),
     "noxattr": ("/tmp/kopen-new/inkfs", "mode=posix,noxattr")}
P, M = "/dev/shm/kopen-m.pool", "/tmp/kopen-mm"
os.makedirs(M, exist_ok=True)
rounds, n = int(sys.argv[1]), int(sys.argv[2])
res = {k: [] for k in V}
def once(k):
    b, o = V[k]
    subprocess.run(["rm", "-f", P]); subprocess.run([b, "mkfs", P, "--size", "512M"], check=True, capture_output=True)
    subprocess.run([b, "mount", P, M, "-o", o], check=True)
    try:
        t = time.perf_counter()
        for i in range(n):
            fd = os.open(f"{M}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
            os.write(fd, b"x" * 100); os.fchown(fd, 0, 0); os.close(fd)
        dt = time.perf_counter() - t
    finally:
        subprocess.run(["fusermount3", "-u", M], check=True); os.remove(P)
    return dt
print("load at start:", open("/proc/loadavg").read().strip())
for r in range(rounds):
    for k in (["base", "noxattr"] if r % 2 == 0 else ["noxattr", "base"]):
        res[k].append(once(k))
    print(r, {k: round(v[-1], 3) for k, v in res.items()}, flush=True)
print("load at end:", open("/proc/loadavg").read().strip())
for k, v in res.items():
    print(k, "median %.3f s, min %.3f, max %.3f" % (statistics.median(v), min(v), max(v)))
rat = [a / b for a, b in zip(res["base"], res["noxattr"])]
print("per-round speed-up (base/noxattr): median %.3f, min %.3f, max %.3f; noxattr faster in %d of %d" % (statistics.median(rat), min(rat), max(rat), sum(x > 1 for x in rat), len(rat)))
