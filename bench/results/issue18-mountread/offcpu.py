#!/usr/bin/env python3
"""Off-CPU time of the server's threads during one cold pass, by why they
left the CPU. Inputs: `perf script` of `perf record -e sched:sched_switch -g
-p SERVER` (the stack at each switch-out) and of `perf sched record` (every
switch on the machine: when each thread ran again). The two recordings'
clocks differ by ~0.1 ms, so each switch-out of the first is matched to the
nearest one of the same thread and state in the second.
Usage: offcpu.py SWITCH.txt SCHED.txt"""
import bisect, collections, re, sys
outs = collections.defaultdict(list)  # pid -> [(t, state, comm, reason)]
for ev in open(sys.argv[1]).read().split("\n\n"):
    m = re.search(r"^\s*(\S+)\s+(\d+)\s+\[\d+\]\s+([\d.]+): sched:sched_switch: .*prev_state=(\S+)", ev, re.M)
    if not m:
        continue
    comm, pid, t, st = m.group(1), int(m.group(2)), float(m.group(3)), m.group(4)
    if st.startswith("R"):
        r = "preempted (runnable, waiting for a CPU)"
    elif "fuse_dev_do_read" in ev:
        r = "idle: waiting for a FUSE request"
    elif "pread" in ev or "iomap_dio" in ev:
        r = "device read (pread, O_DIRECT)"
    elif "next_job" in ev:
        r = "readahead worker: no job queued"
    elif "futex" in ev:
        r = "futex (a lock, or wait_load's condvar)"
    else:
        r = "other"
    outs[pid].append((t, st[0], comm, r))
# every switch of those threads, machine-wide: (t, 'out'/'in', state)
seq = collections.defaultdict(list)
for line in open(sys.argv[2]):
    m = re.search(r"\s([\d.]+):\s+sched:sched_switch: prev_comm=.* prev_pid=(\d+) .*prev_state=(\S+) ==> "
                  r"next_comm=.* next_pid=(\d+)", line)
    if not m:
        continue
    t, prev, st, nxt = float(m.group(1)), int(m.group(2)), m.group(3), int(m.group(4))
    if prev in outs:
        seq[prev].append((t, "out", st[0]))
    if nxt in outs:
        seq[nxt].append((t, "in", ""))
# The pass: from the readahead's first device read to its last one's end.
ra_reads = [t for pid in seq for (t, kind, st) in seq[pid] if kind == "out" and st == "D"
            and re.match(r"inkfs-ra", outs[pid][0][2])]
lo, hi = min(ra_reads), max(ra_reads)
print(f"window: the readahead's device reads, {(hi - lo) * 1e3:.1f} ms, {len(ra_reads)} reads")
tot = collections.defaultdict(float)
cnt = collections.Counter()
for pid, evs in seq.items():
    evs.sort()
    mine = outs[pid]
    times = [x[0] for x in mine]
    for i, (t, kind, st) in enumerate(evs):
        if kind != "out":
            continue
        nxt_in = next((e[0] for e in evs[i + 1:] if e[1] == "in"), None)
        if nxt_in is None or nxt_in < lo or t > hi:
            continue
        # Only the part inside the window.
        t, nxt_in = max(t, lo), min(nxt_in, hi)
        j = bisect.bisect_left(times, t)
        cands = [k for k in (j - 1, j) if 0 <= k < len(mine) and mine[k][1] == st and abs(mine[k][0] - t) < 0.002]
        if not cands:
            continue
        k = min(cands, key=lambda k: abs(mine[k][0] - t))
        g = re.sub(r"\d+$", "*", mine[k][2])
        tot[(g, mine[k][3])] += nxt_in - t
        cnt[(g, mine[k][3])] += 1
for (g, r), v in sorted(tot.items(), key=lambda x: (x[0][0], -x[1])):
    print(f"{g:10s} {r:42s} {cnt[(g, r)]:6d} times {v * 1e3:9.1f} ms off CPU")
