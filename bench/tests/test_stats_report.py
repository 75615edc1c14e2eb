"""Medians, spreads, ratio computation and the tables built from them."""

import json
import os
import tempfile
import unittest

from inkbench import report
from inkbench.stats import fmt_num, median, speedup, spread


class StatsTest(unittest.TestCase):
    def test_median(self):
        self.assertEqual(median([3, 1, 2]), 2)
        self.assertEqual(median([4, 1, 2, 3]), 2.5)
        self.assertIsNone(median([]))
        self.assertEqual(median([float("nan"), 5]), 5)

    def test_spread_is_half_range_over_median(self):
        self.assertAlmostEqual(spread([90, 100, 110]), 0.1)
        self.assertEqual(spread([7]), 0)
        self.assertIsNone(spread([]))

    def test_speedup_throughput(self):
        self.assertAlmostEqual(speedup(200, 100, True), 2.0)
        self.assertAlmostEqual(speedup(50, 100, True), 0.5)

    def test_speedup_time_is_inverted(self):
        # 1 s against ext4's 2 s is twice as fast
        self.assertAlmostEqual(speedup(1.0, 2.0, False), 2.0)

    def test_speedup_missing(self):
        self.assertIsNone(speedup(None, 1, True))
        self.assertIsNone(speedup(1, None, True))
        self.assertIsNone(speedup(1, 0, True))

    def test_fmt(self):
        self.assertEqual(fmt_num(12345), "12.3k")
        self.assertEqual(fmt_num(2.5e6), "2.50M")
        self.assertEqual(fmt_num(None), "–")


def fake_results():
    w_fio = {"title": "fio", "stands_for": "x", "unit": "IOPS", "higher_is_better": True, "reps": 3,
             "params": {}, "contenders": ["tmpfs", "ext4", "null-fs", "inkfs-strict"], "cases": {}}
    for case, vals in {"randwrite-fsync-1j": (600, 20, 100, 95), "randread-1j": (900, 50, 100, 80)}.items():
        w_fio["cases"][case] = {c: {"values": [v * 0.9, v, v * 1.1], "raw": [{}] * 3, "errors": []}
                                for c, v in zip(w_fio["contenders"], vals)}
    w_meta = {"title": "meta", "stands_for": "y", "unit": "seconds", "higher_is_better": False, "reps": 2,
              "params": {}, "contenders": ["tmpfs", "ext4", "inkfs-strict"],
              "cases": {"untar": {"tmpfs": {"values": [1, 1], "raw": [], "errors": []},
                                  "ext4": {"values": [2, 2], "raw": [], "errors": []},
                                  "inkfs-strict": {"values": [], "raw": [], "errors": ["boom"]}}}}
    w_rocks = {"title": "rocksdb", "stands_for": "z", "unit": "ops/s", "higher_is_better": True,
               "unavailable": "db_bench not found", "cases": {}, "contenders": []}
    for w in (w_fio, w_meta, w_rocks):
        report.summarize(w)
    return {"meta": {"date": "2026-01-01", "mode": "quick", "command": "bench/run --quick",
                     "machine": {"cpu": "cpu", "cores": 2, "kernel": "k", "mem_gib": 1, "loadavg_start": ["0.5"]},
                     "versions": {"fio": "3.33"}, "contenders": {}},
            "workloads": {"fio": w_fio, "meta": w_meta, "rocksdb": w_rocks}}


class ReportTest(unittest.TestCase):
    def test_ratios(self):
        res = fake_results()
        r = res["workloads"]["fio"]["ratios"]["randwrite-fsync-1j"]["inkfs-strict"]
        self.assertAlmostEqual(r["vs_ext4"], 95 / 20)
        self.assertAlmostEqual(r["vs_tmpfs"], 95 / 600)
        self.assertAlmostEqual(r["vs_null-fs"], 0.95)
        m = res["workloads"]["meta"]["ratios"]["untar"]
        self.assertAlmostEqual(m["tmpfs"]["vs_ext4"], 2.0)  # half the time: twice as fast
        self.assertIsNone(m["inkfs-strict"]["vs_ext4"])     # failed: no ratio

    def test_null_fs_ratio_is_paired_by_repetition(self):
        w = {"higher_is_better": True, "cases": {"c": {
            # A slow spell in repetition 2 hit both servers.
            "null-fs": {"values": [100, 50, 100], "raw": [], "errors": []},
            "inkfs-strict": {"values": [95, 48, 96], "raw": [], "errors": []},
            "ext4": {"values": [10, 10, 10], "raw": [], "errors": []}}}}
        report.summarize(w)
        r = w["ratios"]["c"]["inkfs-strict"]
        self.assertAlmostEqual(r["vs_null-fs"], 0.96)   # median of .95, .96, .96 (medians: .95)
        self.assertAlmostEqual(r["vs_ext4"], 9.5)       # medians, as before
        w["cases"]["c"]["null-fs"]["values"] = [100, 100]  # a failed repetition
        report.summarize(w)
        self.assertAlmostEqual(w["ratios"]["c"]["inkfs-strict"]["vs_null-fs"], 0.95)

    def test_issue5_table_marks_goal(self):
        md = report.issue5_md(fake_results())
        self.assertIn("| randwrite-fsync-1j |", md)
        self.assertIn("0.95× ✓", md)
        self.assertIn("0.80× ✗", md)

    def test_markdown_has_every_workload(self):
        md = report.markdown(fake_results())
        self.assertIn("### fio", md)
        self.assertIn("Speed-up over ext4", md)
        self.assertIn("Speed-up over tmpfs", md)
        self.assertIn("failed", md)            # the failed cell
        self.assertIn("`boom`", md)            # and its error
        self.assertIn("**Not run: db_bench not found.**", md)

    def test_write_json_and_md(self):
        with tempfile.TemporaryDirectory() as d:
            report.write(fake_results(), d)
            with open(os.path.join(d, "results.json")) as f:
                data = json.load(f)
            self.assertEqual(data["workloads"]["fio"]["cases"]["randread-1j"]["ext4"]["median"], 50)
            self.assertTrue(os.path.exists(os.path.join(d, "results.md")))


if __name__ == "__main__":
    unittest.main()


class ResultsPageTest(unittest.TestCase):
    def test_reading_is_kept_and_charts_relinked(self):
        res = fake_results()
        res["workloads"]["fio"]["charts"] = ["fio-vs-ext4.png"]
        page = report.results_page(res, "")
        self.assertIn("_(no reading written yet)_", page)
        self.assertIn("](results/latest/fio-vs-ext4.png)", page)
        edited = page.replace("_(no reading written yet)_", "inkfs wins here, loses there")
        again = report.results_page(res, edited)
        self.assertIn("inkfs wins here, loses there", again)
        self.assertNotIn("no reading written yet", again)
