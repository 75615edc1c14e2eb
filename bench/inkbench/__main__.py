"""bench/run: set up the contenders, run the workloads interleaved, write
tables, JSON and charts, tear everything down (also on failure or Ctrl-C)."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
import traceback

from . import contenders as C
from . import report
from .util import (WORK_PREFIX, CmdError, Cleanup, Progress, cleanup_leftovers, disk_dir,
                   install_signal_handlers, log, run, set_quiet, which)
from .workloads import PROFILES, Ctx, all_workloads

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    m = ap.add_mutually_exclusive_group()
    m.add_argument("--smoke", dest="mode", action="store_const", const="smoke",
                   help="a few seconds per workload: proves the harness works (CI)")
    m.add_argument("--quick", dest="mode", action="store_const", const="quick",
                   help="scaled-down run, < 10 minutes on 2 cores (default)")
    m.add_argument("--full", dest="mode", action="store_const", const="full",
                   help="published sizes, < 1 hour on 2 cores")
    m.add_argument("--selftest", dest="mode", action="store_const", const="selftest",
                   help="run the harness's own tests (bench/tests)")
    m.add_argument("--cleanup", dest="mode", action="store_const", const="cleanup",
                   help="remove what a killed run left behind (mounts, loop devices, servers, files)")
    ap.add_argument("--only", help="comma-separated workloads (micro,fio,filebench,sqlite,rocksdb,redis,meta,copy), "
                    "each optionally NAME:STEP+STEP (e.g. filebench:fileserver+webproxy)")
    ap.add_argument("--contenders", help="comma-separated, from: " + ",".join(C.ALL_NAMES + C.HYBRID_NAMES + C.PRELOAD_NAMES)
                    + " (default: the first seven), or inkfs-MODE@OPTS; the preload ones also "
                    "NAME+ask (the library asks for directory leases), e.g. inkfs-hybrid-preload+ask@OPTS")
    ap.add_argument("--reps", type=int, help="repetitions (overrides the mode's)")
    ap.add_argument("--out", help="output directory (default bench/results/MODE-DATE)")
    ap.add_argument("--inkfs-bin", help="inkfs binary (default: build with cargo)")
    ap.add_argument("--work-bin", help="inkbench-work binary (default: build with cargo)")
    ap.add_argument("--base-bin", help="a directory holding another build's inkfs (and libinkfs_preload.so): "
                    "contenders named base.NAME (e.g. base.inkfs-hybrid) run with it, interleaved with "
                    "this build's NAME, for A/B runs against a baseline build")
    ap.add_argument("--no-build", action="store_true", help="use binaries from the target dir as they are")
    ap.add_argument("--engine-bench", action="store_true",
                    help="also run `cargo bench -p inkfs --bench engine -- --quick` and include its table")
    ap.add_argument("--publish", action="store_true",
                    help="also copy the report, JSON and charts to bench/results/latest/ (for RESULTS.md)")
    ap.add_argument("--quiet", action="store_true", help="no progress display")
    a = ap.parse_args(argv)
    a.mode = a.mode or "quick"
    return a


def target_dir() -> str:
    return os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")


def binaries(a) -> dict:
    rel = os.path.join(target_dir(), "release")
    if not (a.inkfs_bin and a.work_bin) and not a.no_build:
        cargo = which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
        log("building inkfs and inkbench-work (cargo build --release)")
        run([cargo, "build", "--release", "-q", "-p", "inkfs-cli", "-p", "inkfs-bench",
             "-p", "inkfs-preload"], cwd=REPO, timeout=1800)
    bins = {"inkfs": a.inkfs_bin or os.path.join(rel, "inkfs"),
            "work": a.work_bin or os.path.join(rel, "inkbench-work")}
    for k, p in bins.items():
        if not os.access(p, os.X_OK):
            raise CmdError(f"{p} not found: build it (cargo build --release -p inkfs-cli -p inkfs-bench)")
    # The preload library (inkfs-preload contenders): next to the binaries.
    bins["preload"] = os.path.join(os.path.dirname(bins["inkfs"]), "libinkfs_preload.so")
    if a.base_bin:
        base = os.path.abspath(a.base_bin)
        if not os.access(os.path.join(base, "inkfs"), os.X_OK):
            raise CmdError(f"--base-bin {base}: no inkfs binary there")
        bins["base"] = base
    return bins


def first_line(cmd) -> str:
    try:
        p = run(cmd, check=False, timeout=30)
        return ((p.stdout or "") + (p.stderr or "")).strip().splitlines()[0]
    except (CmdError, IndexError):
        return ""


def dpkg_version(pkg: str) -> str:
    return first_line(["dpkg-query", "-W", "-f=${Version}", pkg])


def machine() -> dict:
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) / (1 << 20)
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(), "mem_gib": round(mem, 1),
            "loadavg_start": open("/proc/loadavg").read().split()[:3], "hostname": platform.node()}


def versions(bins) -> dict:
    import sqlite3
    v = {"inkfs": first_line(["git", "-C", REPO, "describe", "--always", "--dirty"]),
         "fio": first_line(["fio", "--version"]), "sqlite": sqlite3.sqlite_version,
         "rocksdb-tools": dpkg_version("rocksdb-tools"), "redis": dpkg_version("redis-server"),
         "e2fsprogs": dpkg_version("e2fsprogs"), "git": first_line(["git", "--version"]),
         "python": platform.python_version(), "rustc": first_line(["rustc", "--version"])}
    try:
        import matplotlib
        v["matplotlib"] = matplotlib.__version__
    except ImportError:
        v["matplotlib"] = None
    return v


def rotate(xs, k):
    k %= max(len(xs), 1)
    return xs[k:] + xs[:k]


def selftest() -> int:
    """The harness's own tests (bench/tests), with this interpreter."""
    import unittest
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    suite = unittest.defaultTestLoader.discover(os.path.join(here, "tests"), top_level_dir=here)
    r = unittest.TextTestRunner(verbosity=1).run(suite)
    print(f"{r.testsRun - len(r.failures) - len(r.errors) - len(r.skipped)} passed, "
          f"{len(r.failures) + len(r.errors)} failed, {len(r.skipped)} skipped")
    return 0 if r.wasSuccessful() else 1


def main(argv=None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    if argv[:1] == ["--selftest"]:
        return selftest()
    a = parse_args(argv)
    set_quiet(a.quiet)
    if os.geteuid() != 0:
        print("bench/run: needs root (mounts, loop devices, FUSE allow_other)", file=sys.stderr)
        return 2
    if a.mode == "cleanup":
        n = cleanup_leftovers()
        log(f"--cleanup: {n} work director{'y' if n == 1 else 'ies'} cleaned")
        return 0
    install_signal_handlers()
    cleanup_leftovers(verbose=True)
    profile = dict(PROFILES[a.mode])
    if a.reps:
        profile["reps"] = a.reps
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    outdir = a.out or os.path.join(REPO, "bench", "results", f"{a.mode}-{stamp}")
    work = f"{WORK_PREFIX}{os.getpid()}"
    cleanup = Cleanup()
    cleanup.push(f"rm -rf {work}", lambda: run(["rm", "-rf", "--one-file-system", work], check=False, timeout=300))
    disk = disk_dir(work)
    cleanup.push(f"rm -rf {disk}", lambda: run(["rm", "-rf", "--one-file-system", disk], check=False, timeout=300))
    os.makedirs(os.path.join(work, "mnt"))
    t_start = time.monotonic()
    res = {"meta": {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                    "mode": a.mode, "command": "bench/run " + " ".join(argv),
                    "machine": machine(), "profile": profile, "contenders": {}, "notes": []},
           "workloads": {}}
    status = 0
    try:
        bins = binaries(a)
        res["meta"]["versions"] = versions(bins)
        ctx = Ctx(work, bins, profile, a.mode)
        names = a.contenders.split(",") if a.contenders else list(C.ALL_NAMES)
        cons = [C.make(n, work, profile.get("lib_fs_size", profile["fs_size"])
                       if n.startswith("inkfs-lib") else profile["fs_size"], bins) for n in names]
        for c in cons:
            res["meta"]["contenders"][c.name] = c.describe
        wls = all_workloads(ctx, REPO)
        if a.only:
            # NAME or NAME:STEP+STEP (e.g. fio:randwrite-1j+seqwrite128k-1j).
            want = dict(o.partition(":")[::2] for o in a.only.split(","))
            unknown = set(want) - {w.name for w in wls}
            if unknown:
                raise CmdError(f"unknown workload(s): {', '.join(sorted(unknown))}")
            wls = [w for w in wls if w.name in want]
            for w in wls:
                if want[w.name]:
                    try:
                        w.restrict(want[w.name].split("+"))
                    except ValueError as e:
                        raise CmdError(str(e))
        total = 0
        for w in wls:
            if not w.unavailable():
                total += profile["reps"] * len(w.steps()) * sum(1 for c in cons if w.applies(c))
        prog = Progress(total)
        log(f"--{a.mode}: {len(wls)} workloads, {len(cons)} contenders, {profile['reps']} repetitions, "
            f"{total} measurements; work dir {work}; results to {outdir}")
        for w in wls:
            run_workload(w, cons, profile["reps"], res, prog, cleanup)
        if a.engine_bench:
            log("engine micro-benchmarks (cargo bench -p inkfs --bench engine -- --quick)")
            try:
                p = run(["cargo", "bench", "-q", "-p", "inkfs", "--bench", "engine", "--", "--quick"],
                        cwd=REPO, timeout=1800)
                res["engine_bench"] = p.stdout
            except CmdError as e:
                res["meta"]["notes"].append(f"engine bench failed: {e}")
    except KeyboardInterrupt as e:
        log(f"interrupted ({e or 'Ctrl-C'}): tearing down")
        status = 130
    except CmdError as e:
        log(f"error: {e}")
        status = 1
    finally:
        cleanup.run_all()
    load_end = open("/proc/loadavg").read().split()[:3]
    res["meta"]["loadavg_end"] = load_end
    res["meta"]["elapsed_s"] = round(time.monotonic() - t_start, 1)
    cores = os.cpu_count() or 1
    res["meta"]["noisy"] = max(float(res["meta"]["machine"]["loadavg_start"][0]), float(load_end[0])) > cores
    pools = [st for w in res["workloads"].values() for st in w.get("pool_backends", [])]
    res["meta"]["pool_backend"] = pools[0] if pools else "?"
    if res["workloads"]:
        report.write(res, outdir)
        log(f"results: {outdir}/results.md, results.json" + (" (partial)" if status else ""))
        if a.publish:
            import shutil
            latest = os.path.join(REPO, "bench", "results", "latest")
            shutil.rmtree(latest, ignore_errors=True)
            shutil.copytree(outdir, latest)
            page = os.path.join(REPO, "bench", "RESULTS.md")
            old = open(page).read() if os.path.exists(page) else ""
            with open(page, "w") as f:
                f.write(report.results_page(res, old))
            log(f"published to {latest} and {page}")
        for extra in (report.issue5_md(res), report.goals_md(res)):
            if extra:
                print(extra)
    log(f"done in {res['meta']['elapsed_s']:.0f} s")
    if status == 0:
        failed = [(wn, case, c) for wn, w in res["workloads"].items() for case, per in w.get("cases", {}).items()
                  for c, r in per.items() if r.get("errors")]
        if failed:
            log(f"{len(failed)} measurement(s) failed; see Errors in results.md")
            status = 3
    return status


def run_workload(w, cons, reps, res, prog, cleanup) -> None:
    wres = {"title": w.title, "stands_for": w.stands_for, "unit": w.unit,
            "higher_is_better": w.higher_is_better, "reps": reps, "cases": {}, "contenders": [],
            "params": {}, "unavailable": None}
    res["workloads"][w.name] = wres
    why = w.unavailable()
    if why:
        wres["unavailable"] = why
        log(f"{w.name}: NOT RUN: {why}")
        return
    cs = [c for c in cons if w.applies(c)]
    log(f"{w.name}: {w.title}; contenders {', '.join(c.name for c in cs)}")
    up = []
    try:
        w.prepare()
        wres["params"] = w.params()
        log(f"{w.name}: parameters {wres['params']}")
        for c in cs:
            try:
                c.setup(cleanup)
                up.append(c)
                ps = c.info.get("pool_stat")
                if ps:
                    wres.setdefault("pool_backends", []).append(
                        ps.get("backend") or ps.get("backend_kind") or str(ps)[:120])
            except (CmdError, OSError) as e:
                log(f"{w.name}: {c.name}: setup failed: {e}")
                for case in w.cases():
                    wres["cases"].setdefault(case, {})[c.name] = {"values": [], "raw": [],
                                                                  "errors": [f"setup: {e}"]}
        wres["contenders"] = [c.name for c in cs]
        for case in w.cases():
            for c in cs:
                wres["cases"].setdefault(case, {}).setdefault(c.name, {"values": [], "raw": [], "errors": []})
        dead = {}
        for rep in range(reps):
            for step in w.steps():
                for c in rotate(up, rep):
                    label = f"{w.name} {step} rep {rep + 1}/{reps} {c.name}"
                    if c.name in dead:
                        prog.step(f"{label}: skipped ({dead[c.name]})")
                        continue
                    try:
                        out = w.run(c, step, rep)
                        for case, r in out.items():
                            slot = wres["cases"][case][c.name]
                            slot["values"].append(r["value"])
                            slot["raw"].append(r["raw"])
                        prog.step(f"{label}: " + ", ".join(
                            f"{case} {r['value']:.4g}" for case, r in list(out.items())[:4]))
                    except (CmdError, OSError, ValueError, KeyError) as e:
                        msg = str(e)
                        proc = getattr(c, "proc", None)
                        if proc is not None and proc.poll() is not None:
                            tail = open(c.logfile).read().strip()[-300:] if os.path.exists(c.logfile) else ""
                            dead[c.name] = f"server exited with {proc.returncode}"
                            msg += f" [FUSE server exited with {proc.returncode}: {tail}]"
                        for case in w.cases() if step not in w.cases() else [step]:
                            wres["cases"][case][c.name]["errors"].append(msg)
                        prog.step(f"{label}: FAILED: {msg[:300]}")
    except (CmdError, OSError) as e:
        wres["error"] = str(e)
        log(f"{w.name}: failed: {e}")
        traceback.print_exc()
    finally:
        for c in reversed(up):
            try:
                c.teardown()
            except Exception as e:  # noqa: BLE001
                log(f"{w.name}: teardown of {c.name}: {e}")
        w.finish()
        report.summarize(wres)


if __name__ == "__main__":
    sys.exit(main())
