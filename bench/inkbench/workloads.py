"""The workloads, each named after what it stands for. A workload has
steps (one external run each: a fio job, a filebench personality, a
journal mode...), and each step yields the figures of one or more cases."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from typing import Dict, List, Optional

from . import parsers
from .contenders import DATA, DIRS, LIB, POSIX, Contender
from .util import CmdError, log, run, which, wait_for

# Per mode: repetitions, sizes and durations. --quick must finish in < 10
# minutes on 2 cores, --full in < 1 hour, --smoke in < 3 minutes.
PROFILES = {
    "smoke": dict(reps=2, fs_size=768 << 20, micro_ops=200,
                  fio_size="8m", fio_runtime="500ms", fio_big_size="64m",
                  fio_cases=["randwrite-fsync-1j", "randread-1j"],
                  fb_files_div=100, fb_threads_div=10, fb_seconds=0.5,
                  sqlite_inserts=100, sqlite_seconds=5,
                  rocks_num={"sync1": 200, "sync0": 2000},
                  redis_requests=500, tree_files=300, copy_bytes=8 << 20),
    "quick": dict(reps=3, fs_size=2 << 30, micro_ops=1000,
                  fio_size="32m", fio_runtime="1s", fio_cases=None, fio_big_size="512m",
                  fb_files_div=5, fb_threads_div=1, fb_seconds=1.0,
                  sqlite_inserts=600, sqlite_seconds=5,
                  rocks_num={"sync1": 2000, "sync0": 50000},
                  redis_requests=5000, tree_files=2000, copy_bytes=64 << 20),
    # inkfs-lib gets 6 GiB: through the library the engine appends ~0.8 GB/s
    # to webserver's log, and a 4 GiB pool filled in the 6 s run (ENOSPC)
    # before the log was rotated at 128 MiB (filebench.rs LOG_ROTATE_BYTES);
    # kept so results stay comparable with the published runs. The others
    # keep 4 GiB: a workload sets up every contender at once, and three fully
    # allocated 8 GiB FUSE pools exceed /dev/shm on 24 GiB.
    "full": dict(reps=5, fs_size=4 << 30, lib_fs_size=6 << 30, micro_ops=5000,
                 fio_size="256m", fio_runtime="3s", fio_cases=None, fio_big_size="2g",
                 fb_files_div=1, fb_threads_div=1, fb_seconds=6,
                 sqlite_inserts=5000, sqlite_seconds=20,
                 rocks_num={"sync1": 20000, "sync0": 200000},
                 redis_requests=50000, tree_files=8000, copy_bytes=256 << 20),
}


class Ctx:
    """What the workloads share: binaries, work directory, profile."""

    def __init__(self, work: str, bins: dict, profile: dict, mode: str) -> None:
        self.work = work
        self.bins = bins
        self.p = profile
        self.mode = mode
        self.seq = 0

    def scratch(self, c: Contender, label: str) -> str:
        """A fresh directory on contender c (its root when it has no dirs)."""
        self.seq += 1
        if DIRS not in c.caps:
            return c.mnt
        d = os.path.join(c.mnt, f"{label}-{self.seq}")
        os.makedirs(d)
        return d

    def clear(self, c: Contender, d: str) -> None:
        if d == c.mnt:
            for e in os.listdir(d):
                p = os.path.join(d, e)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
        else:
            shutil.rmtree(d, ignore_errors=True)


class Workload:
    name = "?"
    title = "?"
    stands_for = ""
    unit = "?"
    higher_is_better = True
    needs_any: List[set] = [{POSIX}]

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx

    def unavailable(self) -> Optional[str]:
        return None

    def steps(self) -> List[str]:
        return ["run"]

    def restrict(self, keep: List[str]) -> None:
        """Run only the steps in `keep` (`--only NAME:STEP+STEP`)."""
        every = self.steps()
        unknown = set(keep) - set(every)
        if unknown:
            raise ValueError(f"{self.name} has no step(s) {', '.join(sorted(unknown))} "
                             f"(its steps: {', '.join(every)})")
        chosen = [s for s in every if s in keep]
        self.steps = lambda: chosen  # type: ignore[method-assign]

    def cases(self) -> List[str]:
        return self.steps()

    def params(self) -> dict:
        return {}

    def prepare(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def applies(self, c: Contender) -> bool:
        return any(n <= set(c.caps) for n in self.needs_any)

    def run(self, c: Contender, step: str, rep: int) -> Dict[str, dict]:
        raise NotImplementedError


# ------------------------------------------------------------------ micro

class Micro(Workload):
    name = "micro"
    title = "Micro: single-operation latencies"
    stands_for = ("the cost of one system call of each kind, one thread: create (+close), stat, "
                  "readdir of the whole directory, 4 KiB append + fsync, 4 KiB overwrite "
                  "(with and without fsync), delete (unlink)")
    unit = "µs (median latency)"
    higher_is_better = False
    needs_any = [{POSIX}, {LIB}]
    OPS = ["create", "stat", "readdir", "append4k+fsync", "overwrite4k", "overwrite4k+fsync", "delete"]

    def cases(self) -> List[str]:
        return self.OPS

    def params(self) -> dict:
        n = self.ctx.p["micro_ops"]
        return {"ops_per_kind": n, "readdir_entries": n, "readdir_listings": max(5, min(200, n // 20)),
                "overwrite_file_pages": max(n, 256), "runner": "inkbench-work micro (Rust)"}

    def run(self, c: Contender, step: str, rep: int) -> Dict[str, dict]:
        d = self.ctx.scratch(c, "micro") if LIB not in c.caps else None
        target = ["--dir", d] if d else c.target_args()
        try:
            p = run([self.ctx.bins["work"], "micro", *target, "--ops", str(self.ctx.p["micro_ops"]),
                     "--seed", str(rep + 1), "--keep", "400"], timeout=300, env=c.env())
        finally:
            if d:
                self.ctx.clear(c, d)
        data = parsers.work_json(p.stdout)
        out = {}
        for op, s in data["ops"].items():
            out[op] = {"value": s["p50_ns"] / 1000.0, "raw": s}
        return out


# ------------------------------------------------------------------ fio

class Fio(Workload):
    name = "fio"
    title = "fio: psync I/O, 4 KiB blocks (128 KiB in the seqwrite128k and seqread128k cases)"
    stands_for = ("block-sized I/O through read/write system calls (psync), one file per job: "
                  "random write (in place over a laid-out file), sequential write, sequential read, random read; "
                  "`-fsync` = fsync after every write")
    unit = "IOPS (all jobs)"
    higher_is_better = True
    needs_any = [{POSIX}]
    ALL = [f"{rw}{s}-{j}j" for rw in ("randwrite", "seqwrite") for s in ("-fsync", "") for j in (1, 2)] + \
          ["seqwrite128k-1j", "seqwrite128k-fsync-1j", "seqread128k-1j", "randread-1j", "randread-2j"]
    # Issue 16's durable rows (fdatasync after every write), asked for by
    # name with --only fio:seqwrite-fdatasync-1j+...: not in the default set.
    # Issue 18's cold read: one pass of 128 KiB reads over a file of
    # fio_big_size (its own file, laid out once), larger than a hybrid
    # mount's DRAM cache when it runs with data_cache= below that (the
    # time-based cases loop over a 32 MiB file that any cache holds).
    # Issue 18's like-for-like sequential writes (a strict or sync inkfs
    # write is durable on return, ext4's buffered one is not):
    # seqwrite128k-endfsync-big-1j writes a new file of fio_big_size in one
    # pass and fsyncs it at the end, inside the timed run (fio counts
    # end_fsync in the job's runtime): every contender's data is durable
    # when the figure stops; seqwrite128k-dsync-1j opens with O_DSYNC, each
    # write durable on return on every contender (the promise of strict and
    # sync mounts).
    EXTRA = ["seqwrite-fdatasync-1j", "randwrite-fdatasync-1j", "randwrite-fdatasync-2j",
             "seqread128k-big-1j", "seqwrite128k-endfsync-big-1j", "seqwrite128k-dsync-1j"]

    def __init__(self, ctx: Ctx) -> None:
        super().__init__(ctx)
        self.dirs: Dict[str, str] = {}

    def prepare(self) -> None:
        self.dirs = {}

    def unavailable(self) -> Optional[str]:
        return None if which("fio") else "fio is not installed (apt-get install fio)"

    def steps(self) -> List[str]:
        return self.ctx.p["fio_cases"] or self.ALL

    def restrict(self, keep: List[str]) -> None:
        extra = [k for k in keep if k in self.EXTRA]
        rest = [k for k in keep if k not in self.EXTRA]
        if rest:
            super().restrict(rest)
        chosen = (self.steps() if rest else []) + extra
        self.steps = lambda: chosen  # type: ignore[method-assign]

    @staticmethod
    def job_args(case: str) -> List[str]:
        m = re.fullmatch(r"(randwrite|seqwrite|seqread|randread)(128k)?(-fsync|-fdatasync|-endfsync|-dsync)?(-big)?"
                         r"-(\d)j", case)
        if not m:
            raise ValueError(case)
        rw = {"randwrite": "randwrite", "seqwrite": "write", "seqread": "read", "randread": "randread"}[m.group(1)]
        a = [f"--rw={rw}", f"--numjobs={m.group(5)}", f"--bs={m.group(2) or '4k'}"]
        if m.group(3) == "-endfsync":
            a.append("--end_fsync=1")
        elif m.group(3) == "-dsync":
            a.append("--sync=dsync")
        elif m.group(3):
            a.append(f"-{m.group(3)}=1")
        if rw == "randwrite":
            a.append("--overwrite=1")
        return a

    def params(self) -> dict:
        return {"ioengine": "psync", "bs": "4k (128k where the case says so)", "size_per_job": self.ctx.p["fio_size"],
                "big_size": self.ctx.p["fio_big_size"] + " (the -big cases: one pass, not time based)",
                "runtime": self.ctx.p["fio_runtime"], "time_based": True, "fallocate": "none",
                "randwrite": "--overwrite=1 (file laid out first)", "invalidate": "fio default (1)",
                "files": "f.0, f.1 per contender, laid out once, reused by every job",
                "cases": self.steps()}

    def run(self, c: Contender, step: str, rep: int) -> Dict[str, dict]:
        # One directory per contender for the whole workload: the job files
        # (f.0, f.1) are laid out once and reused by every job and repetition.
        d = self.dirs.get(c.name)
        if d is None:
            d = self.dirs[c.name] = self.ctx.scratch(c, "fio")
        if "-big-" in step and step.startswith("seqwrite"):
            # A new file each time (see EXTRA): its old copy removed first,
            # untimed, so every repetition allocates as the first did.
            for old in glob.glob(os.path.join(d, "bigw.*")):
                os.unlink(old)
            sizing = [f"--size={self.ctx.p['fio_big_size']}", "--filename_format=bigw.$jobnum"]
        elif "-big-" in step:
            # One pass over a file of its own (see EXTRA).
            sizing = [f"--size={self.ctx.p['fio_big_size']}", "--filename_format=big.$jobnum"]
        else:
            sizing = [f"--size={self.ctx.p['fio_size']}", f"--runtime={self.ctx.p['fio_runtime']}", "--time_based",
                      "--filename_format=f.$jobnum"]
        cmd = ["fio", "--name=job", f"--directory={d}", "--ioengine=psync", *sizing,
               "--group_reporting", "--output-format=json", "--fallocate=none", "--randrepeat=1",
               *self.job_args(step)]
        p = run(cmd, timeout=300, env=c.env())
        r = parsers.fio_json(p.stdout)
        if r["errors"]:
            raise CmdError(f"fio reported errors: {r['errors']}")
        return {step: {"value": r["iops"], "raw": r}}


# ------------------------------------------------------------------ filebench

FB_PUBLISHED = {
    # personality: nfiles, meandirwidth, filesize, nthreads, iosize, meanappendsize, prealloc %
    "fileserver": dict(nfiles=10000, dirwidth=20, filesize=128 << 10, threads=50, prealloc=80),
    "varmail": dict(nfiles=1000, dirwidth=1000000, filesize=16 << 10, threads=16, prealloc=80),
    "webserver": dict(nfiles=1000, dirwidth=20, filesize=16 << 10, threads=100, prealloc=100),
    "webproxy": dict(nfiles=10000, dirwidth=1000000, filesize=16 << 10, threads=100, prealloc=80),
}
FB_FLOW = {
    "fileserver": "createfile, writewholefile, closefile, openfile, appendfilerand 16k, closefile, "
                  "openfile, readwholefile, closefile, deletefile, statfile",
    "varmail": "deletefile, createfile, appendfilerand 16k, fsync, closefile, openfile, readwholefile, "
               "appendfilerand 16k, fsync, closefile, openfile, readwholefile, closefile",
    "webserver": "10 × (openfile, readwholefile, closefile), appendfilerand 16k to a shared log "
                 "(rotated at 128 MiB)",
    "webproxy": "deletefile, createfile, appendfilerand 16k, closefile, 5 × (openfile, readwholefile, closefile)",
}


class Filebench(Workload):
    name = "filebench"
    title = "filebench personalities (our reproduction)"
    stands_for = ("fileserver (NFS-like file server), varmail (mail server: small files, fsync-heavy), "
                  "webserver (read-mostly, shared log), webproxy (web cache: create/delete + reads) — "
                  "filebench's published fileset, thread counts and flowop sequences, run by inkbench-work")
    unit = "ops/s (filebench flowops)"
    higher_is_better = True
    needs_any = [{POSIX, DIRS, DATA}, {LIB}]

    def steps(self) -> List[str]:
        return list(FB_PUBLISHED)

    def scaled(self, pers: str) -> dict:
        p = FB_PUBLISHED[pers]
        return dict(nfiles=max(20, p["nfiles"] // self.ctx.p["fb_files_div"]), dirwidth=p["dirwidth"],
                    filesize=p["filesize"], threads=max(2, p["threads"] // self.ctx.p["fb_threads_div"]),
                    iosize=1 << 20, appendsize=16 << 10, prealloc=p["prealloc"],
                    seconds=self.ctx.p["fb_seconds"])

    def params(self) -> dict:
        return {pers: {**self.scaled(pers), "filesizegamma": 1.5, "flowops": FB_FLOW[pers],
                       "published": FB_PUBLISHED[pers]} for pers in FB_PUBLISHED}

    def run(self, c: Contender, step: str, rep: int) -> Dict[str, dict]:
        d = self.ctx.scratch(c, "fb") if LIB not in c.caps else None
        target = ["--dir", d] if d else c.target_args()
        s = self.scaled(step)
        args = ["--personality", step, "--seed", str(rep + 1)]
        for k in ("nfiles", "dirwidth", "filesize", "threads", "iosize", "appendsize", "prealloc", "seconds"):
            args += [f"--{k}", str(s[k])]
        try:
            p = run([self.ctx.bins["work"], "filebench", *target, *args], timeout=600, env=c.env())
        finally:
            if d:
                self.ctx.clear(c, d)
        data = parsers.work_json(p.stdout)
        return {step: {"value": data["result"]["ops_per_s"], "raw": data["result"]}}


# ------------------------------------------------------------------ SQLite

class Sqlite(Workload):
    name = "sqlite"
    title = "SQLite: one insert per transaction"
    stands_for = ("an embedded database committing every row: each INSERT its own transaction, "
                  "synchronous=FULL, 100-byte rows, in each journal mode")
    unit = "inserts/s"
    higher_is_better = True
    needs_any = [{POSIX, DIRS, DATA}]

    def steps(self) -> List[str]:
        return ["DELETE", "TRUNCATE", "PERSIST", "WAL"]

    def params(self) -> dict:
        return {"inserts": self.ctx.p["sqlite_inserts"], "time_cap_s": self.ctx.p["sqlite_seconds"],
                "synchronous": "FULL", "row": "INTEGER PRIMARY KEY + 100-byte blob",
                "sqlite_version": sqlite3.sqlite_version,
                "client": "python sqlite3 module, in a process of its own (timed inside it)"}

    def run(self, c: Contender, step: str, rep: int) -> Dict[str, dict]:
        # In a process of its own (the same Python, the same sqlite3
        # module), so that a contender's environment (the preload library)
        # reaches the client and never the harness; timed inside it.
        d = self.ctx.scratch(c, "sqlite")
        try:
            p = run([sys.executable, "-c", SQLITE_CLIENT, os.path.join(d, "bench.db"), step,
                     str(self.ctx.p["sqlite_inserts"]), str(self.ctx.p["sqlite_seconds"])],
                    timeout=600, env=c.env())
        finally:
            self.ctx.clear(c, d)
        r = json.loads(p.stdout)
        return {step: {"value": r["inserts"] / r["seconds"], "raw": r}}


# One insert per transaction: argv = db, journal mode, inserts, time cap (s).
SQLITE_CLIENT = """
import json, os, sqlite3, sys, time
path, mode, n, cap = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
db = sqlite3.connect(path, isolation_level=None)
got = db.execute(f"PRAGMA journal_mode={mode}").fetchone()[0]
if got.upper() != mode:
    sys.exit(f"journal_mode={mode} refused (got {got})")
db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
blob = os.urandom(100)
t0 = time.perf_counter()
done = 0
while done < n:
    db.execute("INSERT INTO t (v) VALUES (?)", (blob,))
    done += 1
    if done % 50 == 0 and time.perf_counter() - t0 > cap:
        break
el = time.perf_counter() - t0
(count,) = db.execute("SELECT count(*) FROM t").fetchone()
db.close()
if count != done:
    sys.exit(f"table has {count} rows, {done} inserted")
print(json.dumps({"inserts": done, "seconds": el}))
"""


# ------------------------------------------------------------------ RocksDB

class Rocksdb(Workload):
    name = "rocksdb"
    title = "RocksDB db_bench fillunique (filluniquerandom) and fillseq"
    stands_for = ("a log-structured key-value store loading unique keys in random order; "
                  "--sync=1 fsyncs the write-ahead log on every put")
    unit = "ops/s"
    higher_is_better = True
    needs_any = [{POSIX, DIRS, DATA}]

    def unavailable(self) -> Optional[str]:
        return None if which("db_bench") else \
            "db_bench not found: Debian's rocksdb-tools is not installed (apt-get install rocksdb-tools)"

    def steps(self) -> List[str]:
        return ["sync1", "sync0", "fillseq-sync0"]

    def params(self) -> dict:
        return {"benchmarks": "filluniquerandom (db_bench's name for fillunique); fillseq for fillseq-sync0",
                "num": self.ctx.p["rocks_num"], "value_size": 100, "compression_type": "none",
                "threads": 1, "note": "Debian's db_bench is built with assertions on (it says so)"}

    def run(self, c: Contender, step: str, rep: int) -> Dict[str, dict]:
        d = self.ctx.scratch(c, "rocksdb")
        bench = "fillseq" if step.startswith("fillseq") else "filluniquerandom"
        num = self.ctx.p["rocks_num"][step.rpartition("-")[2]]
        cmd = ["db_bench", f"--benchmarks={bench}", f"--num={num}",
               f"--sync={1 if step.endswith('sync1') else 0}", f"--db={d}/db", "--compression_type=none",
               "--value_size=100", "--threads=1", f"--seed={rep + 1}"]
        try:
            p = run(cmd, timeout=600, env=c.env())
        finally:
            self.ctx.clear(c, d)
        r = parsers.db_bench(p.stdout)[bench]
        return {step: {"value": r["ops_per_sec"], "raw": r}}


# ------------------------------------------------------------------ Redis

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class Redis(Workload):
    name = "redis"
    title = "Redis SET, appendfsync always"
    stands_for = ("an in-memory key-value server that logs every write to its append-only file "
                  "and fsyncs it before answering (appendonly yes, appendfsync always); "
                  "redis-benchmark SET over 127.0.0.1")
    unit = "requests/s"
    higher_is_better = True
    needs_any = [{POSIX, DIRS, DATA}]

    def unavailable(self) -> Optional[str]:
        missing = [b for b in ("redis-server", "redis-benchmark") if not which(b)]
        return f"{', '.join(missing)} not installed (apt-get install redis-server)" if missing else None

    def steps(self) -> List[str]:
        return ["SET"]

    def params(self) -> dict:
        return {"requests": self.ctx.p["redis_requests"], "clients": 16, "value_bytes": 64,
                "keyspace": 100000, "bind": "127.0.0.1", "appendonly": "yes", "appendfsync": "always",
                "save": "(none)", "version": run(["redis-server", "--version"], check=False).stdout.strip()}

    def run(self, c: Contender, step: str, rep: int) -> Dict[str, dict]:
        d = self.ctx.scratch(c, "redis")
        port = free_port()
        pidfile = os.path.join(self.ctx.work, f"redis-{port}.pid")
        logf = open(os.path.join(self.ctx.work, "redis.log"), "w")
        proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port),
                                 "--protected-mode", "yes", "--dir", d, "--appendonly", "yes",
                                 "--appendfsync", "always", "--save", "", "--daemonize", "no",
                                 "--logfile", ""],
                                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                                env=c.env())
        logf.close()
        with open(pidfile, "w") as f:
            f.write(str(proc.pid))
        try:
            wait_for(lambda: redis_ping(port) or proc.poll() is not None, 20, "redis-server")
            if proc.poll() is not None:
                raise CmdError("redis-server exited: " + open(os.path.join(self.ctx.work, "redis.log")).read()[-300:])
            p = run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-t", "set",
                     "-n", str(self.ctx.p["redis_requests"]), "-c", "16", "-d", "64", "-r", "100000", "--csv"],
                    timeout=300)
            r = parsers.redis_csv(p.stdout)["SET"]
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            os.unlink(pidfile)
            self.ctx.clear(c, d)
        return {step: {"value": r["rps"], "raw": r}}


# ------------------------------------------------------------------ metadata

def cargo_sources(lockfile: str) -> List[str]:
    """The registry sources of the crates in Cargo.lock that are on this
    machine (cargo fetched them to build inkfs)."""
    home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    text = open(lockfile).read()
    out = []
    for name, ver in re.findall(r'name = "([^"]+)"\nversion = "([^"]+)"\nsource = "registry', text):
        hits = sorted(glob.glob(os.path.join(home, "registry", "src", "*", f"{name}-{ver}")))
        if hits:
            out.append(hits[0])
    return out


class Meta(Workload):
    name = "meta"
    title = "Metadata-heavy: a source tree"
    stands_for = ("a developer's tree: untar of a git checkout of Rust sources (the crates inkfs "
                  "builds from, plus its .git), `git status` on it, `rm -rf` of it")
    unit = "seconds"
    higher_is_better = False
    needs_any = [{POSIX, DIRS, DATA}]

    def __init__(self, ctx: Ctx, repo: str) -> None:
        super().__init__(ctx)
        self.repo = repo
        self.tar = os.path.join(ctx.work, "tree.tar")
        self.tree_info: dict = {}

    def unavailable(self) -> Optional[str]:
        missing = [b for b in ("tar", "git") if not which(b)]
        return f"{', '.join(missing)} not installed" if missing else None

    def steps(self) -> List[str]:
        return ["tree"]

    def cases(self) -> List[str]:
        return ["untar", "git-status", "rm-rf"]

    def params(self) -> dict:
        return {"tree": self.tree_info, "untar": "tar -xf (no sync)", "git_status": "git status --porcelain",
                "rm": "rm -rf"}

    def prepare(self) -> None:
        budget = self.ctx.p["tree_files"]
        stage = os.path.join(self.ctx.work, "stage")
        tree = os.path.join(stage, "tree")
        os.makedirs(tree)
        files = 0
        srcs = cargo_sources(os.path.join(self.repo, "Cargo.lock"))
        used = []
        for s in srcs:
            n = sum(len(fs) for _, _, fs in os.walk(s))
            if files + n > budget or n > budget // 2 and files > 0:
                continue
            shutil.copytree(s, os.path.join(tree, os.path.basename(s)), symlinks=True)
            files += n
            used.append(os.path.basename(s))
        if files < budget // 4:  # no cargo cache: this repository's own sources
            p = run(["git", "-C", self.repo, "ls-files"], check=False)
            for rel in p.stdout.splitlines():
                src = os.path.join(self.repo, rel)
                if os.path.isfile(src):
                    dst = os.path.join(tree, "inkfs", rel)
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    shutil.copy2(src, dst)
                    files += 1
            used.append("inkfs (this repository)")
        env = dict(os.environ, GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@localhost",
                   GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="bench@localhost")
        run(["git", "init", "-q", tree], env=env)
        run(["git", "-C", tree, "add", "-A", "-f"], env=env, timeout=300)
        run(["git", "-C", tree, "commit", "-q", "-m", "tree"], env=env, timeout=300)
        run(["tar", "-cf", self.tar, "-C", stage, "tree"], timeout=300)
        shutil.rmtree(stage)
        nent = len(run(["tar", "-tf", self.tar]).stdout.splitlines())
        self.tree_info = {"source_files": files, "tar_entries_incl_git": nent,
                          "tar_bytes": os.path.getsize(self.tar), "crates": len(used)}

    def finish(self) -> None:
        if os.path.exists(self.tar):
            os.unlink(self.tar)

    def run(self, c: Contender, step: str, rep: int) -> Dict[str, dict]:
        d = self.ctx.scratch(c, "meta")
        out = {}
        env = c.env(dict(os.environ, GIT_CONFIG_NOSYSTEM="1", HOME=self.ctx.work))
        try:
            for case, cmd in (("untar", ["tar", "-xf", self.tar, "-C", d]),
                              ("git-status", ["git", "-c", f"safe.directory=*", "-C", os.path.join(d, "tree"),
                                              "status", "--porcelain"]),
                              ("rm-rf", ["rm", "-rf", os.path.join(d, "tree")])):
                t0 = time.perf_counter()
                p = run(cmd, timeout=600, env=env)
                el = time.perf_counter() - t0
                if case == "git-status" and p.stdout.strip():
                    raise CmdError(f"git status after untar is not clean: {p.stdout[:200]}")
                out[case] = {"value": el, "raw": {"seconds": el}}
        finally:
            self.ctx.clear(c, d)
        return out


# ------------------------------------------------------------------ copy

class Copy(Workload):
    name = "copy"
    title = "cp of a large file inside the file system"
    stands_for = ("copying a file within one file system (`cp`, coreutils >= 9 uses copy_file_range): "
                  "a file of random bytes laid out once per contender, copied once per repetition; "
                  "the copy is compared with the source (untimed) and removed")
    unit = "seconds"
    higher_is_better = False
    needs_any = [{POSIX, DATA}]

    def __init__(self, ctx: Ctx) -> None:
        super().__init__(ctx)
        self.dirs: Dict[str, str] = {}

    def unavailable(self) -> Optional[str]:
        missing = [b for b in ("cp", "cmp") if not which(b)]
        return f"{', '.join(missing)} not installed" if missing else None

    def prepare(self) -> None:
        self.dirs = {}

    def steps(self) -> List[str]:
        return ["cp"]

    def params(self) -> dict:
        return {"bytes": self.ctx.p["copy_bytes"], "command": "cp SRC DST", "check": "cmp SRC DST (untimed)"}

    def run(self, c: Contender, step: str, rep: int) -> Dict[str, dict]:
        d = self.dirs.get(c.name)
        if d is None:
            d = self.dirs[c.name] = self.ctx.scratch(c, "copy")
            with open(os.path.join(d, "src"), "wb") as f:
                left = self.ctx.p["copy_bytes"]
                while left > 0:
                    n = min(left, 1 << 20)
                    f.write(os.urandom(n))
                    left -= n
        src, dst = os.path.join(d, "src"), os.path.join(d, "dst")
        t0 = time.perf_counter()
        run(["cp", src, dst], timeout=600, env=c.env())
        el = time.perf_counter() - t0
        p = run(["cmp", src, dst], timeout=600, check=False)
        os.unlink(dst)
        if p.returncode != 0:
            raise CmdError(f"the copy differs from its source: {p.stdout[:200]}")
        return {step: {"value": el, "raw": {"seconds": el}}}


def all_workloads(ctx: Ctx, repo: str) -> List[Workload]:
    return [Micro(ctx), Fio(ctx), Filebench(ctx), Sqlite(ctx), Rocksdb(ctx), Redis(ctx), Meta(ctx, repo),
            Copy(ctx)]
