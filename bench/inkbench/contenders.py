"""The file systems compared, each set up and torn down by the harness.

Every contender lives under the run's work directory
(/dev/shm/inkbench-<pid>/): pools, the ext4 image, mount points, pid files.
Capabilities say which workloads a contender can run: `null-fs` has one
directory and stores no data, `inkfs-lib` is reachable only from the Rust
workload runner (micro, filebench)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import List, Optional

from .util import CmdError, Cleanup, log, mounted, run, umount, wait_for

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

    def setup(self, cleanup: Cleanup) -> None:
        os.makedirs(self.mnt, exist_ok=True)
        self.img = os.path.join(self.work, "ext4.img")
        self.loop = None
        cleanup.push(f"tear down {self.name}", self.teardown)
        with open(self.img, "wb") as f:
            f.truncate(self.size)
        run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.img], timeout=120)
        self.loop = run(["losetup", "-f", "--show", self.img], timeout=30).stdout.strip()
        run(["mount", "-t", "ext4", self.loop, self.mnt], timeout=60)
        os.chmod(self.mnt, 0o1777)
        self.info = {"loop": self.loop, "image_bytes": self.size,
                     "mkfs.ext4": run(["mkfs.ext4", "-V"], check=False).stderr.strip().splitlines()[0:1]}

    def teardown(self) -> None:
        umount(self.mnt)
        if getattr(self, "loop", None):
            run(["losetup", "-d", self.loop], check=False, timeout=30)
            self.loop = None
        if os.path.exists(getattr(self, "img", "")):
            os.unlink(self.img)


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
            opts.append(extra)
        self.mode = base
        self.opts = ",".join([f"mode={base}"] + opts)
        self.name = "inkfs-" + spec
        cache = " (no writeback cache)" if "nowriteback_cache" in opts else ""
        more = f", -o {extra}" if extra else ""
        self.describe = f"inkfs over FUSE, mode={base}{cache}{more}, pool in /dev/shm"
        self.durable = True
        super().__init__(*a, **kw)

    def prepare(self) -> None:
        self.pool = os.path.join(self.work, f"{self.name.replace('/', '_')}.pool")
        run([self.bins["inkfs"], "mkfs", self.pool, "--size", str(self.size), "--force"], timeout=120)
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


def make(name: str, work: str, size: int, bins: dict) -> Contender:
    if name == "tmpfs":
        return Tmpfs(work, size, bins)
    if name == "ext4":
        return Ext4Loop(work, size, bins)
    if name == "null-fs":
        return NullFs(work, size, bins)
    if name.startswith("inkfs-lib"):
        mode = name[len("inkfs-lib-"):] if name != "inkfs-lib" else "strict"
        return InkfsLib(mode, work, size, bins)
    if name.startswith("inkfs-"):
        return InkfsFuse(name[len("inkfs-"):], work, size, bins)
    raise ValueError(f"unknown contender {name}")
