"""Markdown tables, the JSON file and the PNG charts of a run."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

from .stats import fmt_num, fmt_ratio, fmt_spread, median, paired_speedup, speedup, spread

# ext4-disk: issue 18's baseline for hybrid pools (ext4 on the same disk).
BASELINES = ("ext4", "tmpfs", "ext4-disk")

# NOVA over ext4-DAX (the goals the figures are read against; not enforced).
GOALS = [
    ("filebench", "fileserver", 1.9),
    ("filebench", "varmail", 3.5),
    ("filebench", "webproxy", 1.26),
    ("filebench", "webserver", 1.0),
    ("sqlite", "WAL", 1.36),
    ("rocksdb", "sync1", 4.8),
    ("redis", "SET", 1.16),
]

ISSUE5_CASES = ["randwrite-fsync-1j", "randwrite-fsync-2j", "randwrite-1j", "randwrite-2j",
                "randread-1j", "randread-2j"]
ISSUE5_GOAL = 0.9


def summarize(wres: dict) -> None:
    """Fill median, spread and ratios of one workload's results in place."""
    hib = wres["higher_is_better"]
    ratios: Dict[str, Dict[str, dict]] = {}
    for case, per in wres["cases"].items():
        for c, r in per.items():
            r["median"] = median(r["values"])
            r["spread"] = spread(r["values"])
        ratios[case] = {}
        for c, r in per.items():
            ratios[case][c] = {f"vs_{b}": speedup(r["median"], per.get(b, {}).get("median"), hib)
                               for b in BASELINES}
            # Issue 5's ratio is a small difference between two FUSE servers:
            # paired by repetition when every repetition of both ran.
            null = per.get("null-fs", {}).get("values", [])
            ratios[case][c]["vs_null-fs"] = (
                paired_speedup(r["values"], null, hib)
                or speedup(r["median"], per.get("null-fs", {}).get("median"), hib))
    wres["ratios"] = ratios


def _row(cells: List[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def workload_md(wname: str, w: dict) -> str:
    out = [f"### {wname}: {w['title']}", ""]
    out.append(f"Stands for: {w['stands_for']}.")
    out.append("")
    if w.get("unavailable"):
        out += [f"**Not run: {w['unavailable']}.**", ""]
        return "\n".join(out)
    out.append(f"Unit: {w['unit']} ({'higher' if w['higher_is_better'] else 'lower'} is better); "
               f"median of {w['reps']} interleaved repetitions, ± half the range.")
    out.append("")
    out.append("Parameters: `" + json.dumps(w["params"], separators=(", ", ": ")) + "`")
    out.append("")
    cs = w["contenders"]
    cases = list(w["cases"])
    out.append(_row(["case"] + cs))
    out.append(_row(["---"] * (len(cs) + 1)))
    for case in cases:
        cells = [case]
        for c in cs:
            r = w["cases"][case].get(c)
            if r is None:
                cells.append("n/a")
            elif r["median"] is None:
                cells.append("failed")
            else:
                cells.append(fmt_num(r["median"]) + fmt_spread(r["spread"]))
        out.append(_row(cells))
    out.append("")
    for base in BASELINES:
        if base not in cs:
            continue
        out.append(f"Speed-up over {base} (× > 1: faster than {base}):")
        out.append("")
        others = [c for c in cs if c != base]
        out.append(_row(["case"] + others))
        out.append(_row(["---"] * (len(others) + 1)))
        for case in cases:
            out.append(_row([case] + [fmt_ratio(w["ratios"][case].get(c, {}).get(f"vs_{base}")) for c in others]))
        out.append("")
    errs = [(case, c, e) for case, per in w["cases"].items() for c, r in per.items() for e in r.get("errors", [])]
    if errs:
        out.append("Errors:")
        out.append("")
        seen = set()
        for case, c, e in errs:
            key = (c, e[:120])
            if key in seen:
                continue
            seen.add(key)
            out.append(f"- {c} / {case}: `{e[:300]}`")
        out.append("")
    for chart in w.get("charts", []):
        out.append(f"![{wname}]({chart})")
        out.append("")
    return "\n".join(out)


def issue5_md(res: dict) -> Optional[str]:
    w = res["workloads"].get("fio")
    if not w or w.get("unavailable"):
        return None
    cases = [c for c in ISSUE5_CASES if c in w["cases"]]
    if not cases:
        return None
    inks = [c for c in w["contenders"] if c.startswith("inkfs-")]
    cols = ["null-fs"] + inks + ["ext4", "tmpfs"]
    cols = [c for c in cols if c in w["contenders"]]
    out = ["### Issue 5: FUSE overhead — fio 4 KiB psync, inkfs vs null-fs", "",
           f"IOPS (median); goal: every inkfs mode ≥ {ISSUE5_GOAL}× null-fs on every job. "
           "The ratio is the median over repetitions of inkfs ÷ null-fs run back to back.", ""]
    head = ["job"] + cols + [f"{c} / null-fs" for c in inks]
    out.append(_row(head))
    out.append(_row(["---"] * len(head)))
    for case in cases:
        per = w["cases"][case]
        cells = [case] + [fmt_num(per.get(c, {}).get("median")) for c in cols]
        for c in inks:
            r = w["ratios"][case].get(c, {}).get("vs_null-fs")
            mark = "" if r is None else (" ✓" if r >= ISSUE5_GOAL else " ✗")
            cells.append(fmt_ratio(r) + mark)
        out.append(_row(cells))
    out.append("")
    return "\n".join(out)


def goals_md(res: dict) -> Optional[str]:
    rows = []
    mode_cols = ["inkfs-strict", "inkfs-sync", "inkfs-posix", "inkfs-lib"]
    for wname, case, goal in GOALS:
        w = res["workloads"].get(wname)
        if not w or w.get("unavailable") or case not in w["cases"]:
            continue
        cells = [f"{wname} {case}", f"{goal}×"]
        for c in mode_cols:
            cells.append(fmt_ratio(w["ratios"][case].get(c, {}).get("vs_ext4")) if c in w["contenders"] else "n/a")
        rows.append(_row(cells))
    if not rows:
        return None
    return "\n".join(["### Against the goals (NOVA over ext4-DAX; here: over ext4 on a loop device)", "",
                      _row(["workload", "goal"] + mode_cols), _row(["---"] * (len(mode_cols) + 2)), *rows, ""])


def machine_md(meta: dict) -> str:
    m = meta["machine"]
    lines = [f"- Date: {meta['date']}; mode: `--{meta['mode']}`; harness: `{meta['command']}`",
             f"- CPU: {m['cpu']} — {m['cores']} cores; memory {m['mem_gib']} GiB; kernel {m['kernel']}",
             f"- Load average (1, 5, 15 min) at start / end: {' '.join(m['loadavg_start'])} / "
             f"{' '.join(meta.get('loadavg_end', ['?']))}"
             + (" — **shared, noisy machine**" if meta.get("noisy") else ""),
             f"- Pool backend: {meta.get('pool_backend', '?')}",
             f"- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v)]
    for c, d in meta.get("contenders", {}).items():
        lines.append(f"- `{c}`: {d}")
    return "\n".join(lines)


def markdown(res: dict) -> str:
    meta = res["meta"]
    parts = [f"## inkfs benchmark — {meta['date']} (`--{meta['mode']}`)", "", machine_md(meta), "",
             "Every ratio compares two contenders measured in the same run, interleaved. "
             "Ratios are speed-ups (throughput ÷ throughput, or time⁻¹ ÷ time⁻¹): > 1 means faster.", ""]
    for extra in (issue5_md(res), goals_md(res)):
        if extra:
            parts += [extra, ""]
    for wname, w in res["workloads"].items():
        parts += [workload_md(wname, w), ""]
    if res.get("engine_bench"):
        parts += ["### Engine micro-benchmarks (cargo bench -p inkfs --bench engine -- --quick)", "",
                  "```", res["engine_bench"].strip(), "```", ""]
    return "\n".join(parts)


def charts(res: dict, outdir: str) -> List[str]:
    """Bar charts of the ratio tables (log scale, 1× marked) and the
    micro-benchmarks' latency distributions. Returns notes (e.g. no
    matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["matplotlib is not installed: no charts (apt-get install python3-matplotlib)"]
    notes = []
    for wname, w in res["workloads"].items():
        if w.get("unavailable") or "ext4" not in w.get("contenders", []):
            continue
        cases = list(w["cases"])
        others = [c for c in w["contenders"] if c != "ext4"]
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cases) + 2), 4))
        width = 0.8 / max(len(others), 1)
        for i, c in enumerate(others):
            vals = [w["ratios"][case].get(c, {}).get("vs_ext4") or 0 for case in cases]
            xs = [k + (i - (len(others) - 1) / 2) * width for k in range(len(cases))]
            ax.bar(xs, [v if v > 0 else float("nan") for v in vals], width, label=c)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels(cases, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("speed-up over ext4 (log)")
        ax.set_title(f"{wname}: {w['title']}", fontsize=10)
        ax.legend(fontsize=7, ncol=3)
        fig.tight_layout()
        name = f"{wname}-vs-ext4.png"
        fig.savefig(os.path.join(outdir, name), dpi=90)
        plt.close(fig)
        w.setdefault("charts", []).append(name)
    w = res["workloads"].get("micro")
    if w and not w.get("unavailable"):
        ops = list(w["cases"])
        cs = w["contenders"]
        fig, axes = plt.subplots(1, len(ops), figsize=(2.3 * len(ops) + 1, 4), sharey=False)
        for ax, op in zip(axes, ops):
            data, labels = [], []
            for c in cs:
                r = w["cases"][op].get(c)
                s = [x / 1000.0 for raw in (r or {}).get("raw", []) for x in raw.get("samples_ns", [])]
                if s:
                    data.append(s)
                    labels.append(c)
            if data:
                ax.boxplot(data, showfliers=False, whis=(1, 99))
                ax.set_xticks(range(1, len(labels) + 1))
                ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
            ax.set_yscale("log")
            ax.set_title(op, fontsize=9)
        axes[0].set_ylabel("latency µs (box: quartiles, whiskers p1–p99)")
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "micro-latency.png"), dpi=90)
        plt.close(fig)
        w.setdefault("charts", []).append("micro-latency.png")
    return notes


def write(res: dict, outdir: str) -> None:
    os.makedirs(outdir, exist_ok=True)
    res["meta"]["notes"] = res["meta"].get("notes", []) + charts(res, outdir)
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    with open(os.path.join(outdir, "results.md"), "w") as f:
        f.write(markdown(res))


READING_START = "<!-- reading: kept by bench/run --publish -->"
READING_END = "<!-- /reading -->"


def results_page(res: dict, old_page: str, charts_dir: str = "results/latest") -> str:
    """bench/RESULTS.md: the run's tables and charts, around the hand-written
    reading kept from the previous page."""
    reading = "_(no reading written yet)_"
    if READING_START in old_page and READING_END in old_page:
        reading = old_page.split(READING_START, 1)[1].split(READING_END, 1)[0].strip()
    md = markdown(res)
    for w in res["workloads"].values():
        for chart in w.get("charts", []):
            md = md.replace(f"]({chart})", f"]({charts_dir}/{chart})")
    meta = res["meta"]
    head = [f"# inkfs benchmark results — `--{meta['mode']}` run of {meta['date']}", "",
            f"Produced by `{meta['command']}` (elapsed {meta.get('elapsed_s', '?')} s); raw figures in "
            f"[{charts_dir}/results.json]({charts_dir}/results.json). Re-run with "
            "`bench/run --quick --publish` (or `--full`); the reading below is kept and must be revised.", "",
            "## Reading", "", READING_START, "", reading, "", READING_END, "", "## Tables and charts", "", ""]
    return "\n".join(head) + md.split("\n", 1)[1].lstrip("\n")
