"""Running commands with time limits, the progress display, and the
cleanup registry that undoes every mount, loop device, server and file the
harness made — on success, failure, Ctrl-C or SIGTERM; `bench/run
--cleanup` does it after a hard kill from what is left on the machine."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from typing import Callable, List, Optional, Sequence

WORK_PREFIX = "/dev/shm/inkbench-"
# Contenders whose data must live on the machine's disk (hybrid pools' data
# files, ext4-disk's image) put it here, under the same <pid> suffix as the
# work directory, so that --cleanup finds it the same way.
DISK_PREFIX = "/var/tmp/inkbench-"


def disk_dir(work: str) -> str:
    """The on-disk twin of a work directory (/dev/shm/inkbench-X ->
    /var/tmp/inkbench-X)."""
    assert work.startswith(WORK_PREFIX), work
    return DISK_PREFIX + work[len(WORK_PREFIX):]


class CmdError(RuntimeError):
    pass


def run(cmd: Sequence[str], timeout: float = 600, cwd: Optional[str] = None,
        env: Optional[dict] = None, check: bool = True, input: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run a command, capture its output, never longer than `timeout`."""
    try:
        p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                           cwd=cwd, env=env, input=input, stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise CmdError(f"{' '.join(cmd)}: no answer in {timeout:.0f} s") from e
    except FileNotFoundError as e:
        raise CmdError(f"{cmd[0]}: not installed") from e
    if check and p.returncode != 0:
        tail = (p.stderr or p.stdout or "").strip().splitlines()[-5:]
        raise CmdError(f"{' '.join(cmd)}: exit {p.returncode}: " + " | ".join(tail))
    return p


def which(name: str) -> Optional[str]:
    for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", "/sbin", "/usr/bin"]:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def mounted(path: str) -> bool:
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 1 and parts[1].replace("\\040", " ") == path:
                return True
    return False


def wait_for(pred: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(interval)
    raise CmdError(f"timed out waiting for {what}")


class Cleanup:
    """Undo actions, run last-in first-out. Each is tried once; failures are
    reported, not raised, so one stuck mount does not strand the others."""

    def __init__(self) -> None:
        self.actions: List[tuple] = []

    def push(self, what: str, fn: Callable[[], None]) -> int:
        self.actions.append((what, fn))
        return len(self.actions) - 1

    def run_one(self, token: int) -> None:
        what, fn = self.actions[token]
        if fn is None:
            return
        self.actions[token] = (what, None)
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - cleanup must go on
            log(f"cleanup: {what}: {e}")

    def run_all(self) -> None:
        for i in range(len(self.actions) - 1, -1, -1):
            self.run_one(i)
        self.actions.clear()


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP behave like Ctrl-C: unwind through the finally
    blocks that tear the contenders down."""
    def handler(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    # SIGINT too: a shell that starts the harness in the background sets
    # SIGINT to "ignore", and Python then installs no KeyboardInterrupt.
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


def umount(path: str) -> None:
    if not mounted(path):
        return
    p = run(["umount", path], timeout=60, check=False)
    if p.returncode != 0 and mounted(path):
        # A dead FUSE server leaves "transport endpoint not connected";
        # a busy mount is detached lazily rather than left behind.
        run(["umount", "-l", path], timeout=60, check=False)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_leftovers(verbose: bool = True) -> int:
    """After a hard kill: everything under /dev/shm/inkbench-<pid> (and its
    on-disk twin /var/tmp/inkbench-<pid>) whose harness <pid> is gone —
    servers (pid files), mounts, loop devices, files."""
    done = 0
    works = [(w, WORK_PREFIX) for w in glob.glob(WORK_PREFIX + "*")]
    works += [(w, DISK_PREFIX) for w in glob.glob(DISK_PREFIX + "*")]
    # /dev/shm first: its mounts hold the loop devices backed by disk files.
    for work, prefix in sorted(works, key=lambda wp: (wp[1] != WORK_PREFIX, wp[0])):
        try:
            owner = int(work[len(prefix):].split("-")[0])
        except ValueError:
            continue
        if owner != os.getpid() and pid_alive(owner):
            if verbose:
                log(f"--cleanup: {work} belongs to running harness {owner}; left alone")
            continue
        for pidfile in glob.glob(os.path.join(work, "**", "*.pid"), recursive=True):
            try:
                with open(pidfile) as f:
                    pid = int(f.read().split()[0])
                os.kill(pid, signal.SIGKILL)
                if verbose:
                    log(f"--cleanup: killed {pid} ({pidfile})")
            except (ValueError, OSError):
                pass
        # mounts, deepest first
        mnts = []
        with open("/proc/self/mounts") as f:
            for line in f:
                mp = line.split()[1].replace("\\040", " ")
                if mp == work or mp.startswith(work + "/"):
                    mnts.append(mp)
        for mp in sorted(mnts, key=len, reverse=True):
            umount(mp)
            if verbose:
                log(f"--cleanup: unmounted {mp}")
        p = run(["losetup", "-l", "-n", "-O", "NAME,BACK-FILE"], check=False, timeout=30)
        for line in (p.stdout or "").splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[1].strip().startswith(work + "/"):
                run(["losetup", "-d", parts[0]], check=False, timeout=30)
                if verbose:
                    log(f"--cleanup: detached {parts[0]}")
        run(["rm", "-rf", "--one-file-system", work], check=False, timeout=300)
        if verbose:
            log(f"--cleanup: removed {work}")
        done += 1
    return done


_t0 = time.monotonic()
_quiet = False


def set_quiet(q: bool) -> None:
    global _quiet
    _quiet = q


def log(msg: str) -> None:
    if not _quiet:
        el = time.monotonic() - _t0
        sys.stderr.write(f"[{int(el // 60):2d}m{int(el % 60):02d}s] {msg}\n")
        sys.stderr.flush()


class Progress:
    """One line per measurement: position, elapsed, estimate of what is left."""

    def __init__(self, total: int) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.t0 = time.monotonic()

    def step(self, msg: str) -> None:
        self.done += 1
        el = time.monotonic() - self.t0
        eta = el / self.done * (self.total - self.done)
        log(f"({self.done:3d}/{self.total}, ~{int(eta // 60)}m{int(eta % 60):02d}s left) {msg}")
