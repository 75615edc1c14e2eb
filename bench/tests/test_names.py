"""Contender names and fio case names, parsed without setting anything up
(no root needed)."""

import unittest

from inkbench import contenders as C
from inkbench.util import CmdError
from inkbench.workloads import Fio


class NamesTest(unittest.TestCase):
    BINS = {"inkfs": "/new/inkfs", "work": "/new/inkbench-work", "preload": "/new/libinkfs_preload.so"}

    def test_base_contender_uses_the_baseline_build(self):
        bins = dict(self.BINS, base="/old")
        c = C.make("base.inkfs-hybrid-preload@data_cache=16M", "/w", 1 << 30, bins)
        self.assertEqual(c.name, "base.inkfs-hybrid-preload@data_cache=16M")
        self.assertEqual(c.mnt, "/w/mnt/base.inkfs-hybrid-preload@data_cache=16M")
        self.assertEqual(c.bins["inkfs"], "/old/inkfs")
        self.assertEqual(c.bins["preload"], "/old/libinkfs_preload.so")
        self.assertIn("data_cache=16M", c.opts)
        # The build under test keeps its own.
        n = C.make("inkfs-hybrid-preload@data_cache=16M", "/w", 1 << 30, bins)
        self.assertEqual(n.bins["inkfs"], "/new/inkfs")
        self.assertNotEqual(n.mnt, c.mnt)

    def test_base_contender_needs_a_base_build_and_an_inkfs_mount(self):
        with self.assertRaises(CmdError):
            C.make("base.inkfs-hybrid", "/w", 1 << 30, self.BINS)
        bins = dict(self.BINS, base="/old")
        for bad in ("base.ext4-disk", "base.inkfs-lib"):
            with self.assertRaises(ValueError):
                C.make(bad, "/w", 1 << 30, bins)

    def test_ask_variant_of_both_preload_contenders(self):
        # `+ask` (before any `@OPTS`) sets INKFS_PRELOAD_DIR_LEASE=1 for the
        # workloads, on PM and hybrid pools alike, and is not a mount option.
        # extra_env() checks the library is there: any existing file does.
        bins = dict(self.BINS, base="/old", preload=__file__)
        for name, opts in (("inkfs-preload+ask", "mode=strict"),
                           ("inkfs-hybrid-preload+ask", "mode=strict"),
                           ("inkfs-hybrid-preload-sync+ask@threads=3", "mode=sync,threads=3"),
                           ("base.inkfs-hybrid-preload+ask", "mode=strict")):
            c = C.make(name, "/w", 1 << 30, bins)
            self.assertEqual(c.name, name)
            self.assertEqual(c.opts, opts)
            if not name.startswith("base."):  # its library is /old's: not there
                self.assertEqual(c.extra_env()["INKFS_PRELOAD_DIR_LEASE"], "1", name)
            self.assertTrue(c.ask, name)
            self.assertIn("directory leases", c.describe)
        self.assertEqual(C.make("base.inkfs-hybrid-preload+ask", "/w", 1 << 30, bins).bins["preload"],
                         "/old/libinkfs_preload.so")
        for name in ("inkfs-preload", "inkfs-hybrid-preload", "inkfs-hybrid-preload@threads=3"):
            self.assertNotIn("INKFS_PRELOAD_DIR_LEASE", C.make(name, "/w", 1 << 30, bins).extra_env(), name)
        # After `@`, '+' joins mount options: not an ask.
        self.assertEqual(C.make("inkfs-hybrid-preload@threads=3+ask", "/w", 1 << 30, bins).opts,
                         "mode=strict,threads=3,ask")
        for bad in ("inkfs-hybrid-preload+asks", "inkfs-hybrid-preload+ask+ask", "inkfs-hybrid+ask"):
            with self.assertRaises(ValueError):
                C.make(bad, "/w", 1 << 30, bins)

    def test_fio_like_for_like_write_cases(self):
        self.assertEqual(Fio.job_args("seqwrite128k-endfsync-big-1j"),
                         ["--rw=write", "--numjobs=1", "--bs=128k", "--end_fsync=1"])
        self.assertEqual(Fio.job_args("seqwrite128k-dsync-1j"),
                         ["--rw=write", "--numjobs=1", "--bs=128k", "--sync=dsync"])
        self.assertEqual(Fio.job_args("seqwrite128k-fsync-1j"),
                         ["--rw=write", "--numjobs=1", "--bs=128k", "--fsync=1"])
        with self.assertRaises(ValueError):
            Fio.job_args("seqwrite128k-osync-1j")


if __name__ == "__main__":
    unittest.main()
