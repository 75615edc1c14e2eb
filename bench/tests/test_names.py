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
