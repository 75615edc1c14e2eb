"""Parsing each tool's output: fio JSON, redis-benchmark CSV, db_bench,
inkbench-work. Fixtures are real outputs of the Debian 12 tools."""

import os
import unittest

from inkbench import parsers

FX = os.path.join(os.path.dirname(__file__), "fixtures")


def fixture(name):
    with open(os.path.join(FX, name)) as f:
        return f.read()


class FioTest(unittest.TestCase):
    def test_real_output(self):
        r = parsers.fio_json(fixture("fio-randwrite-fsync-2j.json"))
        self.assertEqual(r["jobs"], 1)  # group_reporting folds the 2 jobs into one
        self.assertGreater(r["write_iops"], 0)
        self.assertEqual(r["read_iops"], 0)
        self.assertEqual(r["iops"], r["write_iops"])
        self.assertIn("write", r["latency"])
        self.assertGreater(r["latency"]["write"]["p99_ns"], 0)
        self.assertEqual(r["fio_version"], "fio-3.33")

    def test_warnings_before_json_are_skipped(self):
        text = "fio: some warning\n" + fixture("fio-randwrite-fsync-2j.json")
        self.assertGreater(parsers.fio_json(text)["iops"], 0)

    def test_sums_jobs_without_group_reporting(self):
        text = ('{"fio version": "x", "jobs": [{"error": 0, "read": {"iops": 10, "bw": 40, "total_ios": 5},'
                ' "write": {"iops": 0}}, {"error": 0, "read": {"iops": 20.5, "bw": 80, "total_ios": 5},'
                ' "write": {"iops": 0}}]}')
        r = parsers.fio_json(text)
        self.assertEqual(r["read_iops"], 30.5)
        self.assertEqual(r["read_bw_kib"], 120)
        self.assertEqual(r["jobs"], 2)

    def test_errors_counted(self):
        r = parsers.fio_json('{"jobs": [{"error": 5, "read": {}, "write": {}}]}')
        self.assertEqual(r["errors"], 5)

    def test_garbage(self):
        with self.assertRaises(ValueError):
            parsers.fio_json("fio: file system full")
        with self.assertRaises(ValueError):
            parsers.fio_json('{"jobs": []}')


class RedisTest(unittest.TestCase):
    def test_real_output(self):
        r = parsers.redis_csv(fixture("redis-benchmark.csv"))
        self.assertEqual(list(r), ["SET"])
        self.assertAlmostEqual(r["SET"]["rps"], 55555.56)
        self.assertAlmostEqual(r["SET"]["p99_latency_ms"], 0.087)

    def test_old_format_without_header(self):
        r = parsers.redis_csv('"SET","1234.5"\n"GET","99"\n')
        self.assertEqual(r["GET"]["rps"], 99)

    def test_empty(self):
        with self.assertRaises(ValueError):
            parsers.redis_csv("\n")


class DbBenchTest(unittest.TestCase):
    def test_real_output(self):
        r = parsers.db_bench(fixture("db_bench-filluniquerandom.txt"))
        f = r["filluniquerandom"]
        self.assertEqual(f["ops_per_sec"], 32905)
        self.assertAlmostEqual(f["micros_per_op"], 30.363)
        self.assertEqual(f["operations"], 300)
        self.assertAlmostEqual(f["mb_per_s"], 3.6)

    def test_several_benchmarks(self):
        text = ("fillseq      :       2.000 micros/op 500000 ops/sec;   55.3 MB/s\n"
                "readrandom   :       4.5 micros/op 222222 ops/sec 1.0 seconds 222222 operations; (1 of 1 found)\n")
        r = parsers.db_bench(text)
        self.assertEqual(r["fillseq"]["ops_per_sec"], 500000)
        self.assertIsNone(r["fillseq"]["seconds"])
        self.assertEqual(r["readrandom"]["operations"], 222222)

    def test_no_result(self):
        with self.assertRaises(ValueError):
            parsers.db_bench("Invalid argument: --num\n")


class WorkJsonTest(unittest.TestCase):
    def test_last_line(self):
        self.assertEqual(parsers.work_json('noise\n{"a": 1}\n\n'), {"a": 1})

    def test_empty(self):
        with self.assertRaises(ValueError):
            parsers.work_json("")


if __name__ == "__main__":
    unittest.main()
