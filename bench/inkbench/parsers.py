"""Parsing the output of the external tools (fio, redis-benchmark,
db_bench) and of inkbench-work."""

from __future__ import annotations

import csv
import io
import json
import re


def fio_json(text: str) -> dict:
    """fio --output-format=json (with --group_reporting): IOPS, bandwidth
    and completion-latency percentiles of reads and writes summed over jobs.

    fio may print warnings before the JSON object; they are skipped."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in fio output")
    data = json.loads(text[start:])
    jobs = data.get("jobs") or []
    if not jobs:
        raise ValueError("fio output has no jobs")
    out = {"read_iops": 0.0, "write_iops": 0.0, "read_bw_kib": 0.0, "write_bw_kib": 0.0,
           "jobs": len(jobs), "errors": 0, "sync_iops": 0.0}
    lat = {}
    for j in jobs:
        out["errors"] += int(j.get("error", 0))
        for d in ("read", "write"):
            s = j.get(d) or {}
            out[f"{d}_iops"] += float(s.get("iops", 0.0))
            out[f"{d}_bw_kib"] += float(s.get("bw", 0.0))
            clat = (s.get("clat_ns") or {})
            pct = clat.get("percentile") or {}
            if s.get("total_ios", 0):
                lat[d] = {
                    "mean_ns": float(clat.get("mean", 0.0)),
                    "p50_ns": float(pct.get("50.000000", 0.0)),
                    "p99_ns": float(pct.get("99.000000", 0.0)),
                }
        sync = j.get("sync") or {}
        if sync.get("total_ios"):
            out["sync_iops"] += float(sync.get("total_ios", 0)) / max(
                float(j.get("job_runtime", j.get("elapsed", 1))) / 1000.0, 1e-9)
    out["latency"] = lat
    out["iops"] = out["read_iops"] + out["write_iops"]
    out["fio_version"] = data.get("fio version")
    return out


def redis_csv(text: str) -> dict:
    """redis-benchmark --csv: `"test","rps","avg_latency_ms",...` then one
    row per test. Returns {test: {column: float}}."""
    rows = list(csv.reader(io.StringIO(text.strip())))
    rows = [r for r in rows if r]
    if not rows:
        raise ValueError("empty redis-benchmark output")
    if rows[0][0] == "test":
        header, body = rows[0], rows[1:]
    else:  # redis < 7: "SET","12345.67"
        header, body = ["test", "rps"], rows
    out = {}
    for r in body:
        out[r[0]] = {h: float(v) for h, v in zip(header[1:], r[1:])}
    if not out:
        raise ValueError("no rows in redis-benchmark output")
    return out


_DB_BENCH_LINE = re.compile(
    r"^(?P<name>\w+)\s*:\s*(?P<micros>[\d.]+)\s+micros/op\s+(?P<ops>\d+)\s+ops/sec"
    r"(?:\s+(?P<secs>[\d.]+)\s+seconds\s+(?P<n>\d+)\s+operations)?"
    r"(?:;\s*(?P<mbs>[\d.]+)\s+MB/s)?",
    re.M,
)


def db_bench(text: str) -> dict:
    """db_bench's result lines, e.g.
    `filluniquerandom :  2127.292 micros/op 464 ops/sec 4.303 seconds 2000 operations;  0.1 MB/s`.
    Returns {benchmark: {micros_per_op, ops_per_sec, seconds, operations, mb_per_s}}."""
    out = {}
    for m in _DB_BENCH_LINE.finditer(text):
        out[m.group("name")] = {
            "micros_per_op": float(m.group("micros")),
            "ops_per_sec": float(m.group("ops")),
            "seconds": float(m.group("secs")) if m.group("secs") else None,
            "operations": int(m.group("n")) if m.group("n") else None,
            "mb_per_s": float(m.group("mbs")) if m.group("mbs") else None,
        }
    if not out:
        raise ValueError("no result line in db_bench output")
    return out


def work_json(text: str) -> dict:
    """inkbench-work prints one JSON object on its last non-empty line."""
    lines = [l for l in text.splitlines() if l.strip()]
    if not lines:
        raise ValueError("inkbench-work printed nothing")
    return json.loads(lines[-1])
