"""Set-up and tear-down of each contender, the leftover cleanup after a
hard kill, and that Ctrl-C during a run leaves nothing behind. Needs root,
/dev/fuse, loop devices and the built binaries (INKBENCH_INKFS,
INKBENCH_WORK, or the cargo target directory); skipped otherwise."""

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from inkbench import contenders as C
from inkbench.util import WORK_PREFIX, Cleanup, cleanup_leftovers, disk_dir, mounted, run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bins():
    rel = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target"), "release")
    b = {"inkfs": os.environ.get("INKBENCH_INKFS") or os.path.join(rel, "inkfs"),
         "work": os.environ.get("INKBENCH_WORK") or os.path.join(rel, "inkbench-work")}
    if not all(os.access(p, os.X_OK) for p in b.values()):
        return None
    b["preload"] = os.path.join(os.path.dirname(b["inkfs"]), "libinkfs_preload.so")
    return b


def loops_backed_by(prefix):
    p = run(["losetup", "-l", "-n", "-O", "NAME,BACK-FILE"], check=False)
    return [l for l in p.stdout.splitlines() if prefix in l]


def mounts_under(prefix):
    with open("/proc/self/mounts") as f:
        return [l.split()[1] for l in f if l.split()[1].startswith(prefix)]


ROOT = os.geteuid() == 0
HAVE = bins()
SKIP = not ROOT or HAVE is None or not os.path.exists("/dev/fuse")
WHY = "needs root, /dev/fuse and built inkfs + inkbench-work"


@unittest.skipIf(SKIP, WHY)
class ContenderTest(unittest.TestCase):
    def setUp(self):
        # a work directory named after a live pid (ours), as the harness does
        self.work = f"{WORK_PREFIX}{os.getpid()}-test"
        os.makedirs(os.path.join(self.work, "mnt"), exist_ok=True)
        self.cleanup = Cleanup()

    def tearDown(self):
        self.cleanup.run_all()
        disk = disk_dir(self.work)
        left_on_disk = os.listdir(disk) if os.path.isdir(disk) else []
        run(["rm", "-rf", "--one-file-system", self.work, disk], check=False)
        self.assertEqual(mounts_under(self.work), [])
        self.assertEqual(loops_backed_by(self.work), [])
        self.assertEqual(loops_backed_by(disk), [])
        self.assertEqual(left_on_disk, [], "files left on the disk")

    def roundtrip(self, name, data=True):
        c = C.make(name, self.work, 256 << 20, HAVE)
        c.setup(self.cleanup)
        try:
            self.assertTrue(mounted(c.mnt), f"{name} not mounted")
            p = os.path.join(c.mnt, "hello")
            with open(p, "wb") as f:
                f.write(b"x" * 5000)
                os.fsync(f.fileno())
            self.assertEqual(os.path.getsize(p), 5000)
            if data:
                with open(p, "rb") as f:
                    self.assertEqual(f.read(), b"x" * 5000)
            os.unlink(p)
        finally:
            c.teardown()
        self.assertFalse(mounted(c.mnt), f"{name} still mounted")
        c.teardown()  # idempotent
        return c

    def test_tmpfs(self):
        self.roundtrip("tmpfs")

    def test_ext4_loop(self):
        c = self.roundtrip("ext4")
        self.assertEqual(loops_backed_by(self.work), [])
        self.assertFalse(os.path.exists(c.img))

    def test_null_fs(self):
        c = self.roundtrip("null-fs", data=False)
        self.assertIsNone(c.proc)

    def test_inkfs_modes(self):
        for mode in ("strict", "sync", "posix"):
            c = self.roundtrip(f"inkfs-{mode}")
            self.assertFalse(os.path.exists(c.pool), "pool left behind")
            self.assertIn("pool_stat", c.info)

    def test_inkfs_preload(self):
        if not os.path.isfile(HAVE["preload"]):
            self.skipTest("libinkfs_preload.so not built (cargo build --release -p inkfs-preload)")
        for name in ("inkfs-preload", "inkfs-preload-sync"):
            c = self.roundtrip(name)
            self.assertFalse(os.path.exists(c.pool), "pool left behind")
            # The setup's probe ran under the library and was served.
            probe = c.info["preload_probe"]
            self.assertGreaterEqual(probe.get("write_local", 0), 4, probe)
            self.assertEqual(probe.get("attach_refused", 0), 0, probe)
            # The workloads' environment has the library; the harness's not.
            self.assertEqual(c.env()["LD_PRELOAD"], HAVE["preload"])
            self.assertNotIn("libinkfs_preload", os.environ.get("LD_PRELOAD", ""))
            self.assertEqual(C.make("inkfs-strict", self.work, 1 << 20, HAVE).env().get("LD_PRELOAD"),
                             os.environ.get("LD_PRELOAD"))
        self.assertRaises(ValueError, C.make, "inkfs-preload-posix", self.work, 1 << 20, HAVE)
        # Without the library the contender says so at setup, before mounting.
        c = C.make("inkfs-preload", self.work, 1 << 20, dict(HAVE, preload="/nonexistent.so"))
        self.assertRaises(Exception, c.setup, self.cleanup)
        self.assertFalse(mounted(c.mnt))

    def test_ext4_disk(self):
        c = self.roundtrip("ext4-disk")
        self.assertTrue(c.img.startswith(disk_dir(self.work) + "/"), c.img)
        self.assertFalse(os.path.exists(c.img))

    def test_ext4_pmjournal(self):
        c = C.make("ext4-pmjournal", self.work, 256 << 20, HAVE)
        c.setup(self.cleanup)
        try:
            # the journal really is external, on the /dev/shm loop device
            dump = run(["dumpe2fs", "-h", c.loop]).stdout
            self.assertRegex(dump, r"Journal device:\s+0x")
            self.assertTrue(c.jimg.startswith(self.work + "/"), c.jimg)
            self.assertTrue(c.img.startswith(disk_dir(self.work) + "/"), c.img)
        finally:
            c.teardown()
        self.roundtrip("ext4-pmjournal")
        self.assertFalse(os.path.exists(c.jimg))

    def test_inkfs_hybrid_modes(self):
        for name in ("inkfs-hybrid", "inkfs-hybrid-sync", "inkfs-hybrid-posix"):
            c = C.make(name, self.work, 256 << 20, HAVE)
            c.setup(self.cleanup)
            try:
                # a write above the threshold lands on the data file
                with open(os.path.join(c.mnt, "big"), "wb") as f:
                    f.write(b"y" * (1 << 20))
                    os.fsync(f.fileno())
                st = json.loads(run([HAVE["inkfs"], "stat", c.mnt, "--json"]).stdout)
                self.assertIn("data_device", json.dumps(st))
                self.assertTrue(c.data.startswith(disk_dir(self.work) + "/"), c.data)
                self.assertTrue(os.path.exists(c.data))
            finally:
                c.teardown()
            self.assertFalse(os.path.exists(c.data), "data file left behind")
            self.assertFalse(os.path.exists(c.pool), "pool left behind")
        self.assertEqual(C.make("inkfs-hybrid-posix@threads=3", self.work, 1 << 20, HAVE).opts,
                         "mode=posix,threads=3")
        with self.assertRaises(ValueError):
            C.make("inkfs-hybrid-lazy", self.work, 1 << 20, HAVE)

    def test_inkfs_hybrid_preload(self):
        if not os.path.isfile(HAVE["preload"]):
            self.skipTest("libinkfs_preload.so not built (cargo build --release -p inkfs-preload)")
        for name in ("inkfs-hybrid-preload", "inkfs-hybrid-preload-sync"):
            c = self.roundtrip(name)
            self.assertFalse(os.path.exists(c.pool), "pool left behind")
            self.assertFalse(os.path.exists(c.data), "data file left behind")
            # The probe's writes (one above the threshold) were served.
            probe = c.info["preload_probe"]
            self.assertGreaterEqual(probe.get("write_local", 0), 5, probe)
            self.assertEqual(probe.get("write_kernel", 0), 0, probe)
            self.assertEqual(probe.get("attach_refused", 0), 0, probe)
            self.assertEqual(c.env()["LD_PRELOAD"], HAVE["preload"])
        self.assertEqual(C.make("inkfs-hybrid-preload-sync@data_cache=16M", self.work, 1 << 20, HAVE).opts,
                         "mode=sync,data_cache=16M")
        self.assertEqual(C.make("inkfs-hybrid@data_cache=16M+data_readahead=uring", self.work, 1 << 20, HAVE).opts,
                         "mode=strict,data_cache=16M,data_readahead=uring")
        with self.assertRaises(ValueError):
            C.make("inkfs-hybrid-preload-posix", self.work, 1 << 20, HAVE)

    def test_inkfs_hybrid_roundtrip(self):
        self.roundtrip("inkfs-hybrid")

    def test_inkfs_hybrid_mkfs_failure_leaves_no_data_file(self):
        c = C.make("inkfs-hybrid", self.work, 256 << 20, dict(HAVE, inkfs="/bin/false"))
        with self.assertRaises(Exception):
            c.setup(self.cleanup)
        self.cleanup.run_all()
        self.assertFalse(mounted(c.mnt))

    def test_inkfs_lib(self):
        c = C.make("inkfs-lib", self.work, 256 << 20, HAVE)
        c.setup(self.cleanup)
        p = run([HAVE["work"], "micro", *c.target_args(), "--ops", "20", "--keep", "2"])
        self.assertIn('"target":"lib"', p.stdout)
        c.teardown()
        self.assertFalse(os.path.exists(c.pool))

    def test_cleanup_registry_undoes_everything(self):
        for n in ("tmpfs", "ext4", "inkfs-strict"):
            C.make(n, self.work, 256 << 20, HAVE).setup(self.cleanup)
        self.assertEqual(len(mounts_under(self.work)), 3)
        self.cleanup.run_all()
        self.assertEqual(mounts_under(self.work), [])
        self.assertEqual(loops_backed_by(self.work), [])

    def test_teardown_of_a_server_still_starting(self):
        # Ctrl-C can land between starting a FUSE server and its mount
        # appearing: the teardown must unmount what the server mounts
        # after it began, not kill the server with its mount left up.
        c = C.make("null-fs", self.work, 256 << 20, HAVE)
        os.makedirs(c.mnt, exist_ok=True)
        late = ["sh", "-c", 'sleep 0.5; exec "$@"', "late", *c.server_cmd()]
        c.proc = subprocess.Popen(late, start_new_session=True)
        c.teardown()
        self.assertFalse(mounted(c.mnt), "the late server's mount was left behind")
        self.assertIsNone(c.proc)

    def test_setup_failure_is_reported(self):
        c = C.make("inkfs-strict", self.work, 256 << 20, dict(HAVE, inkfs="/bin/false"))
        with self.assertRaises(Exception):
            c.setup(self.cleanup)
        self.assertFalse(mounted(c.mnt))


@unittest.skipIf(SKIP, WHY)
class LeftoverTest(unittest.TestCase):
    def test_cleanup_after_hard_kill(self):
        # A harness pid that is certainly dead.
        p = subprocess.Popen(["true"])
        p.wait()
        work = f"{WORK_PREFIX}{p.pid}"
        os.makedirs(os.path.join(work, "mnt"), exist_ok=True)
        cl = Cleanup()  # never run: as if the harness was SIGKILLed
        for n in ("tmpfs", "ext4", "null-fs", "ext4-pmjournal", "inkfs-hybrid"):
            C.make(n, work, 256 << 20, HAVE).setup(cl)
        sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
        with open(os.path.join(work, "redis-1.pid"), "w") as f:
            f.write(str(sleeper.pid))
        self.assertEqual(len(mounts_under(work)), 5)
        self.assertTrue(os.listdir(disk_dir(work)))
        cleanup_leftovers(verbose=False)
        sleeper.wait(timeout=10)
        self.assertEqual(mounts_under(work), [])
        self.assertEqual(loops_backed_by(work), [])
        self.assertEqual(loops_backed_by(disk_dir(work)), [])
        self.assertFalse(os.path.exists(work))
        self.assertFalse(os.path.exists(disk_dir(work)))

    def test_live_harness_left_alone(self):
        work = f"{WORK_PREFIX}{os.getppid()}-live"
        os.makedirs(work)
        try:
            cleanup_leftovers(verbose=False)
            self.assertTrue(os.path.exists(work))
        finally:
            os.rmdir(work)


@unittest.skipIf(SKIP, WHY)
class InterruptTest(unittest.TestCase):
    def test_ctrl_c_tears_down(self):
        with tempfile.TemporaryDirectory() as out:
            env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            p = subprocess.Popen([sys.executable, "-m", "inkbench", "--smoke", "--only", "filebench",
                                  "--inkfs-bin", HAVE["inkfs"], "--work-bin", HAVE["work"], "--out", out],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            work = f"{WORK_PREFIX}{p.pid}"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(mounts_under(work)) < 3:
                time.sleep(0.05)
            self.assertGreaterEqual(len(mounts_under(work)), 3, "contenders never came up")
            p.send_signal(signal.SIGINT)
            output, _ = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 130, output[-2000:])
            self.assertIn("interrupted", output)
            self.assertEqual(mounts_under(work), [])
            self.assertEqual(loops_backed_by(work), [])
            self.assertFalse(os.path.exists(work))


if __name__ == "__main__":
    unittest.main()
