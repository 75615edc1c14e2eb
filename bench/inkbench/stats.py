"""Medians, spreads and ratios: every figure is compared with contenders
measured in the same run."""

from __future__ import annotations

import math
from typing import Iterable, Optional


def median(values: Iterable[float]) -> Optional[float]:
    v = sorted(x for x in values if x is not None and not math.isnan(x))
    if not v:
        return None
    n = len(v)
    mid = n // 2
    return v[mid] if n % 2 else (v[mid - 1] + v[mid]) / 2


def spread(values: Iterable[float]) -> Optional[float]:
    """Half the range, relative to the median (0.05 = ±5 %)."""
    v = [x for x in values if x is not None and not math.isnan(x)]
    m = median(v)
    if m is None or m == 0:
        return None
    return (max(v) - min(v)) / 2 / abs(m)


def speedup(value: Optional[float], base: Optional[float], higher_is_better: bool) -> Optional[float]:
    """How many times faster `value` is than `base` (> 1: faster).

    Throughputs divide as they are; times and latencies are inverted so that
    a ratio always reads the same way."""
    if value is None or base is None or value <= 0 or base <= 0:
        return None
    return value / base if higher_is_better else base / value


def paired_speedup(values: list, bases: list, higher_is_better: bool) -> Optional[float]:
    """Median over repetitions of `values[i]` against `bases[i]`, when both
    have every repetition (None otherwise). Repetition i of two contenders
    ran back to back, so a slow spell of the machine lands on both sides of
    one ratio instead of on one side of a ratio of medians."""
    if not values or len(values) != len(bases):
        return None
    return median(speedup(v, b, higher_is_better) for v, b in zip(values, bases))


def fmt_num(x: Optional[float]) -> str:
    if x is None:
        return "–"
    a = abs(x)
    if a >= 1e6:
        return f"{x / 1e6:.2f}M"
    if a >= 1e4:
        return f"{x / 1e3:.1f}k"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def fmt_ratio(x: Optional[float]) -> str:
    if x is None:
        return "–"
    return f"{x:.2f}×"


def fmt_spread(s: Optional[float]) -> str:
    if s is None:
        return ""
    return f" ±{s * 100:.0f}%"
