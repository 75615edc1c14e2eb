"""The file systems compared, each set up and torn down by the harness.

Every contender lives under the run's work directory
(/dev/shm/inkbench-<pid>/): pools, the ext4 image, mount points, pid files.
What must be on the machine's disk (a hybrid pool's data file, the images
of ext4-disk and ext4-pmjournal) goes to its on-disk twin,
/var/tmp/inkbench-<pid>/.
Capabilities say which workloads a contender can run: `null-fs` has one
directory and stores no data, `inkfs-lib` is reachable only from the Rust
workload runner (micro, filebench)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import List, Optional

from .util import CmdError, Cleanup, disk_dir, log, mounted, run, umount, wait_for

POSIX = "posix"        # a mounted directory any program can use
DIRS = "dirs"          # can make subdirectories
DATA = "data"          # stores and returns data
LIB = "lib"            # the Rust runner's library backend


class Contender:
    name = "?"
    caps: frozenset = frozenset()
    durable = True
    describe = ""

    def __init__(self, work: str, size: int, bins: dict) -> None:
        self.work = work
        self.size = size
        self.bins = bins
        self.mnt = os.path.join(work, "mnt", self.name)
        self.info: dict = {}

    def setup(self, cleanup: Cleanup) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        pass

    def can(self, needs) -> bool:
        return set(needs) <= set(self.caps)

    def target_args(self) -> List[str]:
        """How inkbench-work reaches this contender."""
        return ["--dir", self.mnt]

    def extra_env(self) -> dict:
        """Environment the workload's own commands run with on this
        contender (never the harness or the tools that set contenders up)."""
        return {}

    def env(self, base: Optional[dict] = None) -> dict:
        """The environment for a workload command: `base` (default: the
        harness's) with this contender's additions."""
        return {**(base if base is not None else os.environ), **self.extra_env()}


class Tmpfs(Contender):
    name = "tmpfs"
    caps = frozenset({POSIX, DIRS, DATA})
    durable = False
    describe = "tmpfs (DRAM, not durable: the speed ceiling)"

    def setup(self, cleanup: Cleanup) -> None:
        os.makedirs(self.mnt, exist_ok=True)
        cleanup.push(f"umount {self.mnt}", self.teardown)
        run(["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=1777", "inkbench-tmpfs", self.mnt], timeout=30)

    def teardown(self) -> None:
        umount(self.mnt)


class Ext4Loop(Contender):
    name = "ext4"
    caps = frozenset({POSIX, DIRS, DATA})
    describe = "ext4 (data=ordered) on a loop device, image in /dev/shm"

    def image_dir(self) -> str:
        return self.work

    def losetup_args(self) -> List[str]:
        return []

    def mkfs_args(self) -> List[str]:
        return []

    def make_image(self) -> None:
        with open(self.img, "wb") as f:
            f.truncate(self.size)

    def setup(self, cleanup: Cleanup) -> None:
        os.makedirs(self.mnt, exist_ok=True)
        os.makedirs(self.image_dir(), exist_ok=True)
        self.img = os.path.join(self.image_dir(), f"{self.name}.img")
        self.loop = None
        self.jloop = None
        cleanup.push(f"tear down {self.name}", self.teardown)
        self.make_image()
        self.loop = run(["losetup", "-f", "--show", *self.losetup_args(), self.img], timeout=30).stdout.strip()
        run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", *self.mkfs_args(),
             self.loop], timeout=300)
        run(["mount", "-t", "ext4", self.loop, self.mnt], timeout=60)
        os.chmod(self.mnt, 0o1777)
        self.info = {"loop": self.loop, "image": self.img, "image_bytes": self.size,
                     "mkfs.ext4": run(["mkfs.ext4", "-V"], check=False).stderr.strip().splitlines()[0:1]}

    def teardown(self) -> None:
        umount(self.mnt)
        for attr in ("loop", "jloop"):
            dev = getattr(self, attr, None)
            if dev:
                run(["losetup", "-d", dev], check=False, timeout=30)
                setattr(self, attr, None)
        for attr in ("img", "jimg"):
            path = getattr(self, attr, "")
            if path and os.path.exists(path):
                os.unlink(path)


class Ext4Disk(Ext4Loop):
    """ext4 on the machine's disk: its image is a preallocated file on the
    disk file system (the one a hybrid pool's data file is on: the "same
    SSD" comparison), attached with direct I/O so that the host's page
    cache does not stand between the loop device and the disk: a flush of
    the loop device is an fsync of the image, i.e. a disk flush."""

    name = "ext4-disk"
    describe = ("ext4 (data=ordered) on a loop device (direct I/O), image preallocated in /var/tmp "
                "on the machine's disk")

    def image_dir(self) -> str:
        return disk_dir(self.work)

    def losetup_args(self) -> List[str]:
        return ["--direct-io=on"]

    def make_image(self) -> None:
        # Preallocated as the hybrid pool's data file is (mkfs --data
        # fallocates it), so neither pays the disk file system's block
        # allocation on a first write.
        with open(self.img, "wb") as f:
            f.truncate(self.size)
            os.posix_fallocate(f.fileno(), 0, self.size)


class Ext4PmJournal(Ext4Disk):
    """ext4-disk with an external journal on a PM stand-in: a 128 MiB
    journal device (`mke2fs -O journal_dev`) whose image is in /dev/shm, the
    peer FSMAC and issue 18 name (`mkfs.ext4 -J device=`)."""

    name = "ext4-pmjournal"
    describe = ("ext4 (data=ordered), data as ext4-disk, external journal (128 MiB) on a loop device "
                "whose image is in /dev/shm")
    JOURNAL_BYTES = 128 << 20

    def mkfs_args(self) -> List[str]:
        self.jimg = os.path.join(self.work, f"{self.name}.journal")
        with open(self.jimg, "wb") as f:
            f.truncate(self.JOURNAL_BYTES)
        self.jloop = run(["losetup", "-f", "--show", self.jimg], timeout=30).stdout.strip()
        run(["mke2fs", "-q", "-F", "-O", "journal_dev", "-b", "4096", self.jloop], timeout=120)
        return ["-b", "4096", "-J", f"device={self.jloop}"]

    def setup(self, cleanup: Cleanup) -> None:
        super().setup(cleanup)
        self.info["journal_loop"] = self.jloop
        self.info["journal_bytes"] = self.JOURNAL_BYTES


class FuseServer(Contender):
    """A FUSE server run in the foreground (-f) by the harness, so its pid is
    known; torn down by unmounting, then waiting for the server to exit."""

    proc: Optional[subprocess.Popen] = None

    def server_cmd(self) -> List[str]:
        raise NotImplementedError

    def prepare(self) -> None:
        pass

    def setup(self, cleanup: Cleanup) -> None:
        os.makedirs(self.mnt, exist_ok=True)
        self.prepare()
        self.logfile = os.path.join(self.work, f"{self.name}.log")
        self.pidfile = os.path.join(self.work, f"{self.name}.pid")
        lf = open(self.logfile, "w")
        self.proc = subprocess.Popen(self.server_cmd(), stdin=subprocess.DEVNULL, stdout=lf, stderr=lf,
                                     start_new_session=True)
        lf.close()
        with open(self.pidfile, "w") as f:
            f.write(str(self.proc.pid))
        cleanup.push(f"stop {self.name}", self.teardown)
        try:
            wait_for(lambda: mounted(self.mnt) or self.proc.poll() is not None, 30, f"{self.name} to mount")
        except CmdError:
            pass
        if not mounted(self.mnt):
            self.teardown()
            raise CmdError(f"{self.name} did not mount: {open(self.logfile).read().strip()[-400:]}")

    def teardown(self) -> None:
        umount(self.mnt)
        if self.proc is not None:
            # Interrupted while the server was still starting, the first
            # umount found nothing: unmount whatever it mounts meanwhile,
            # so that it exits instead of being killed with its mount up.
            deadline = time.monotonic() + 20
            while self.proc.poll() is None and time.monotonic() < deadline:
                umount(self.mnt)
                time.sleep(0.05)
            if self.proc.poll() is None:
                log(f"{self.name}: server still running 20 s after unmount; killing it")
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None
        # A killed server leaves its mount behind ("transport endpoint is
        # not connected"): detach it too.
        umount(self.mnt)
        for p in (getattr(self, "pidfile", None), getattr(self, "pool", None)):
            if p and os.path.exists(p):
                os.unlink(p)


class NullFs(FuseServer):
    name = "null-fs"
    caps = frozenset({POSIX})
    durable = False
    describe = "inkfs null-fs: a FUSE server that stores nothing (FUSE's floor)"

    def server_cmd(self) -> List[str]:
        return [self.bins["inkfs"], "null-fs", self.mnt, "-f"]


class InkfsFuse(FuseServer):
    """`inkfs-MODE`, `inkfs-posix-nocache` (posix mode without the kernel's
    writeback cache, as every mode was before it), and for experiments
    `inkfs-MODE@OPTS`: more mount options (e.g. `inkfs-posix@threads=4`),
    so that variants run interleaved in one run."""

    caps = frozenset({POSIX, DIRS, DATA})

    def __init__(self, spec: str, *a, **kw) -> None:
        base, _, extra = spec.partition("@")
        opts = []
        if base.endswith("-nocache"):
            base = base[:-len("-nocache")]
            opts.append("nowriteback_cache")
        if extra:
            # Several options joined by '+' (--contenders splits on ','):
            # inkfs-hybrid@data_cache=16M+data_readahead=uring.
            opts.append(extra.replace("+", ","))
        self.mode = base
        self.opts = ",".join([f"mode={base}"] + opts)
        self.name = "inkfs-" + spec
        cache = " (no writeback cache)" if "nowriteback_cache" in opts else ""
        more = f", -o {extra}" if extra else ""
        self.describe = f"inkfs over FUSE, mode={base}{cache}{more}, pool in /dev/shm"
        self.durable = True
        super().__init__(*a, **kw)

    def mkfs_args(self) -> List[str]:
        return []

    def prepare(self) -> None:
        self.pool = os.path.join(self.work, f"{self.name.replace('/', '_')}.pool")
        run([self.bins["inkfs"], "mkfs", self.pool, "--size", str(self.size), "--force", *self.mkfs_args()],
            timeout=600)
        try:
            st = run([self.bins["inkfs"], "stat", self.pool, "--json"], timeout=30)
            self.info = {"pool_stat": json.loads(st.stdout)}
        except (CmdError, ValueError):
            self.info = {}

    def server_cmd(self) -> List[str]:
        return [self.bins["inkfs"], "mount", self.pool, self.mnt, "-f", "-o", self.opts]

    def setup(self, cleanup: Cleanup) -> None:
        super().setup(cleanup)
        # A DRAM pool's pages are mapped by a background thread after mount
        # (seconds for GiBs); measuring before it ends would charge its CPU
        # and page-table work to the first repetitions. As ext4's lazy init
        # is switched off for the same reason, wait for it.
        def populated() -> bool:
            st = run([self.bins["inkfs"], "stat", self.mnt, "--json"], timeout=30, check=False)
            try:
                return json.loads(st.stdout).get("pool_populating", 0) == 0
            except ValueError:
                return False
        wait_for(populated, 300, f"{self.name} to map its pool", interval=0.2)


class InkfsHybrid(InkfsFuse):
    """`inkfs-hybrid` (strict), `inkfs-hybrid-sync`, `inkfs-hybrid-posix`
    (and `@OPTS` as for the others): a hybrid pool, metadata and small
    writes on a pool in /dev/shm (the PM stand-in), file data of large
    writes on a data file on the machine's disk (/var/tmp, as ext4-disk's
    image), both of the contender's size."""

    def __init__(self, spec: str, *a, **kw) -> None:
        base, at, extra = spec.partition("@")
        mode = base[len("hybrid-"):] if base.startswith("hybrid-") else "strict"
        if base not in ("hybrid", "hybrid-" + mode) or mode not in ("strict", "sync", "posix"):
            raise ValueError(f"unknown contender inkfs-{spec}")
        super().__init__(mode + at + extra, *a, **kw)
        self.name = "inkfs-" + spec
        self.mnt = os.path.join(self.work, "mnt", self.name)
        more = f", -o {extra}" if extra else ""
        self.describe = (f"inkfs over FUSE, mode={mode}{more}, hybrid pool: metadata and small writes on a pool "
                         "in /dev/shm, large writes' data on a preallocated file in /var/tmp on the machine's disk")

    def mkfs_args(self) -> List[str]:
        ddir = disk_dir(self.work)
        os.makedirs(ddir, exist_ok=True)
        self.data = os.path.join(ddir, f"{self.name.replace('/', '_')}.data")
        return ["--data", self.data, "--data-size", str(self.size)]

    def setup(self, cleanup: Cleanup) -> None:
        # Registered first: a mkfs that fails after creating the data file
        # must not leave gigabytes on the disk.
        cleanup.push(f"rm data file of {self.name}", self.remove_data)
        super().setup(cleanup)

    def remove_data(self) -> None:
        data = getattr(self, "data", None)
        if data and os.path.exists(data):
            os.unlink(data)

    def teardown(self) -> None:
        super().teardown()
        self.remove_data()


def split_ask(spec: str) -> tuple:
    """`NAME+ask@OPTS` -> (`NAME@OPTS`, True); `NAME@OPTS` -> (itself,
    False). `+ask`: the library asks for directory leases
    (INKFS_PRELOAD_DIR_LEASE=1; docs/KERNEL-FREE.md, "Built: the library
    asks for directory leases"), e.g. inkfs-preload+ask,
    base.inkfs-hybrid-preload+ask, inkfs-preload-sync+ask@OPTS. It comes
    before `@`: after it, '+' joins mount options."""
    base, at, extra = spec.partition("@")
    base, plus, ask = base.partition("+")
    if plus and ask != "ask":
        raise ValueError(f"unknown contender inkfs-{spec}")
    return base + at + extra, bool(plus)


ASK_DESCRIBE = ", directory leases asked for (INKFS_PRELOAD_DIR_LEASE=1)"


class InkfsPreload(InkfsFuse):
    """`inkfs-preload` (strict), `inkfs-preload-sync` (and `@OPTS`): an inkfs
    mount as `inkfs-MODE`, with the workload's commands (fio, db_bench,
    redis-server, tar, git, rm, cp, the SQLite client, inkbench-work) run
    with LD_PRELOAD=libinkfs_preload.so: their reads, writes, fsyncs and
    stats are served from the pool in the process, under write leases
    (docs/KERNEL-FREE.md); namespace calls still go through the mount."""

    def __init__(self, spec: str, *a, **kw) -> None:
        plain, self.ask = split_ask(spec)
        base, at, extra = plain.partition("@")
        mode = base[len("preload-"):] if base.startswith("preload-") else "strict"
        if base not in ("preload", "preload-" + mode) or mode not in ("strict", "sync"):
            raise ValueError(f"unknown contender inkfs-{spec}")
        super().__init__(mode + at + extra, *a, **kw)
        self.name = "inkfs-" + spec
        self.mnt = os.path.join(self.work, "mnt", self.name)
        more = f", -o {extra}" if extra else ""
        asks = ASK_DESCRIBE if self.ask else ""
        self.describe = (f"inkfs over FUSE, mode={mode}{more}, pool in /dev/shm, the workload's programs run "
                         f"under the preload library (LD_PRELOAD=libinkfs_preload.so){asks}")

    def library(self) -> str:
        lib = self.bins.get("preload", "")
        if not lib or not os.path.isfile(lib):
            raise CmdError(f"{self.name}: libinkfs_preload.so not found ({lib or 'not built'}): "
                           "cargo build --release -p inkfs-preload")
        return lib

    def extra_env(self) -> dict:
        env = {"LD_PRELOAD": self.library()}
        if getattr(self, "ask", False):
            env["INKFS_PRELOAD_DIR_LEASE"] = "1"
        return env

    def setup(self, cleanup: Cleanup) -> None:
        self.library()
        super().setup(cleanup)
        self.check_served()

    def check_served(self) -> None:
        """A write and a read under the library, counted by it: the mount
        must serve the library (a refused attach would measure the mount)."""
        stats = os.path.join(self.work, f"{self.name}.preload-stats")
        probe = os.path.join(self.mnt, ".preload-probe")
        env = self.env()
        env["INKFS_PRELOAD_STATS"] = stats
        try:
            script = ("import os, sys\n"
                      "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)\n"
                      "for _ in range(4): os.write(fd, bytes(4096))\n"
                      # Above a hybrid pool's 64 KiB threshold: the data
                      # device's path is served too.
                      "os.write(fd, b'x' * 131072)\n"
                      "os.fsync(fd)\n"
                      "assert os.pread(fd, 8192, 0) == bytes(8192)\n"
                      "assert os.pread(fd, 131072, 16384) == b'x' * 131072\n")
            run([sys.executable, "-c", script, probe], env=env, timeout=60)
            counts: dict = {}
            with open(stats) as f:
                for word in f.read().split():
                    k, _, v = word.partition("=")
                    if k != "pid" and v.isdigit():
                        counts[k] = counts.get(k, 0) + int(v)
        finally:
            for p in (stats, probe):
                if os.path.exists(p):
                    os.unlink(p)
        self.info["preload_probe"] = counts
        if counts.get("write_local", 0) < 5 or counts.get("read_local", 0) < 2 or counts.get("attach_refused", 0):
            hint = (" (attach refused: a library from another build? cargo test does not refresh "
                    "target/release/libinkfs_preload.so; run cargo build --release -p inkfs-preload)"
                    if counts.get("attach_refused", 0) else "")
            raise CmdError(f"{self.name}: the mount does not serve the preload library: {counts}{hint}")


class InkfsHybridPreload(InkfsHybrid):
    """`inkfs-hybrid-preload` (strict), `inkfs-hybrid-preload-sync` (and
    `+ask`, `@OPTS` as for `inkfs-preload`): the hybrid pool of
    `inkfs-hybrid`, with the workload's programs under the preload library
    as in `inkfs-preload`: their reads and writes of large files' data go
    to the data device from the process (docs/KERNEL-FREE.md, "Built:
    hybrid pools")."""

    def __init__(self, spec: str, *a, **kw) -> None:
        plain, self.ask = split_ask(spec)
        base, at, extra = plain.partition("@")
        mode = base[len("hybrid-preload-"):] if base.startswith("hybrid-preload-") else "strict"
        if base not in ("hybrid-preload", "hybrid-preload-" + mode) or mode not in ("strict", "sync"):
            raise ValueError(f"unknown contender inkfs-{spec}")
        super().__init__(("hybrid" if mode == "strict" else "hybrid-" + mode) + at + extra, *a, **kw)
        self.name = "inkfs-" + spec
        self.mnt = os.path.join(self.work, "mnt", self.name)
        more = f", -o {extra}" if extra else ""
        asks = ASK_DESCRIBE if self.ask else ""
        self.describe = (f"inkfs over FUSE, mode={mode}{more}, hybrid pool as inkfs-hybrid, the workload's "
                         f"programs run under the preload library (LD_PRELOAD=libinkfs_preload.so){asks}")

    library = InkfsPreload.library
    extra_env = InkfsPreload.extra_env
    check_served = InkfsPreload.check_served

    def setup(self, cleanup: Cleanup) -> None:
        self.library()
        super().setup(cleanup)
        self.check_served()


class InkfsLib(Contender):
    """The engine through its library API, inside the Rust workload runner:
    no kernel, no FUSE. Each run formats a fresh pool in the work directory."""

    caps = frozenset({LIB})

    def __init__(self, mode: str, *a, **kw) -> None:
        self.mode = mode
        self.name = "inkfs-lib" if mode == "strict" else f"inkfs-lib-{mode}"
        self.describe = f"inkfs engine via the library API (no FUSE), mode={mode}"
        super().__init__(*a, **kw)

    def setup(self, cleanup: Cleanup) -> None:
        self.pool = os.path.join(self.work, f"{self.name}.pool")
        cleanup.push(f"rm {self.pool}", self.teardown)

    def teardown(self) -> None:
        if os.path.exists(getattr(self, "pool", "")):
            os.unlink(self.pool)

    def target_args(self) -> List[str]:
        return ["--pool", self.pool, "--pool-size", str(self.size), "--mode", self.mode]


ALL_NAMES = ["tmpfs", "ext4", "null-fs", "inkfs-strict", "inkfs-sync", "inkfs-posix", "inkfs-lib"]
# Issue 18's comparison (not run by default: they need space on the disk):
# hybrid pools against ext4 on the same disk, with and without its journal
# on the PM stand-in.
HYBRID_NAMES = ["inkfs-hybrid", "inkfs-hybrid-sync", "inkfs-hybrid-posix", "ext4-disk", "ext4-pmjournal"]
# Issue 16's: the workloads' programs under the preload library (not run by
# default: name them with --contenders).
PRELOAD_NAMES = ["inkfs-preload", "inkfs-preload-sync", "inkfs-hybrid-preload", "inkfs-hybrid-preload-sync"]
# base.NAME: NAME run with the build given by --base-bin.
BASE_PREFIX = "base."


def make(name: str, work: str, size: int, bins: dict) -> Contender:
    if name.startswith(BASE_PREFIX):
        # base.NAME: NAME with the baseline build's inkfs and preload
        # library (--base-bin DIR), for A/B runs interleaved in one run.
        inner = name[len(BASE_PREFIX):]
        if "base" not in bins:
            raise CmdError(f"{name}: a base. contender needs --base-bin DIR")
        if not inner.startswith("inkfs-") or inner.startswith("inkfs-lib"):
            raise ValueError(f"{name}: only inkfs mounts take a baseline build")
        base_bins = dict(bins, inkfs=os.path.join(bins["base"], "inkfs"),
                         preload=os.path.join(bins["base"], "libinkfs_preload.so"))
        c = make(inner, work, size, base_bins)
        c.name = name
        c.mnt = os.path.join(work, "mnt", name)
        c.describe = f"{c.describe} (baseline build: {bins['base']})"
        return c
    if name == "tmpfs":
        return Tmpfs(work, size, bins)
    if name == "ext4":
        return Ext4Loop(work, size, bins)
    if name == "ext4-disk":
        return Ext4Disk(work, size, bins)
    if name == "ext4-pmjournal":
        return Ext4PmJournal(work, size, bins)
    if name == "null-fs":
        return NullFs(work, size, bins)
    if name.startswith("inkfs-lib"):
        mode = name[len("inkfs-lib-"):] if name != "inkfs-lib" else "strict"
        return InkfsLib(mode, work, size, bins)
    if name.startswith("inkfs-hybrid-preload"):
        return InkfsHybridPreload(name[len("inkfs-"):], work, size, bins)
    if name.startswith("inkfs-hybrid"):
        return InkfsHybrid(name[len("inkfs-"):], work, size, bins)
    if name.startswith("inkfs-preload"):
        return InkfsPreload(name[len("inkfs-"):], work, size, bins)
    if name.startswith("inkfs-"):
        return InkfsFuse(name[len("inkfs-"):], work, size, bins)
    raise ValueError(f"unknown contender {name}")
