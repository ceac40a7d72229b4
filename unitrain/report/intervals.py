"""Medians with their 95% interval: how every speed claim of unitrain is stated."""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

import numpy as np

from unitrain.host.contention import PRIORITY

#: An interval wider than this, relative to its median, is flagged: the machine was too busy
#: (or the runs too few) for the ratio to be trusted to better than that.
WIDE = 0.25


def median_ci(values: Sequence[float], level: float = 0.95, resamples: int = 2000) -> Tuple[float, float, float]:
    """The median and a percentile-bootstrap confidence interval for it (seeded: reproducible)."""
    values_ = np.asarray(values, dtype=float)
    medians = np.median(np.random.default_rng(0).choice(values_, (resamples, len(values_))), axis=1)
    tail = 100 * (1 - level) / 2
    return float(np.median(values_)), float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))


def nested_median_ci(
    groups: Sequence[Sequence[float]], level: float = 0.95, resamples: int = 2000
) -> Tuple[float, float, float]:
    """The median of all values, with a two-level bootstrap interval: groups drawn with
    replacement, then values within each. Values measured in one process share what that process
    drew (compiled kernels, memory layout); resampling the processes too puts the difference
    between them in the interval, which resampling pooled values would hide."""
    rng = np.random.default_rng(0)
    arrays = [np.asarray(g, dtype=float) for g in groups if len(g)]
    medians = np.empty(resamples)
    for i in range(resamples):
        picked = rng.integers(len(arrays), size=len(arrays))
        medians[i] = np.median(np.concatenate([rng.choice(arrays[k], len(arrays[k])) for k in picked]))
    tail = 100 * (1 - level) / 2
    median = float(np.median(np.concatenate(arrays)))
    return median, float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))


def ratio_summary(
    ratios: Sequence[float], groups: Sequence[Sequence[float]] | None = None
) -> Dict[str, float | int | bool]:
    """A ratio measured as interleaved pairs: median, 95% interval, pairs, and whether it is wide;
    ``groups``: the same ratios by the process that measured them."""
    median, low, high = nested_median_ci(groups) if groups else median_ci(ratios)
    return {"median": median, "low": low, "high": high, "pairs": len(ratios), "wide": (high - low) > WIDE * median}


def how_pairs_ran() -> str:
    """What every table of pair ratios says about them, once."""
    return (
        "(wide): an interval wider than a quarter of it; (busy): other work took the cores the pairs needed. "
        "Pairs spread over several processes, run at a raised priority where the system allows "
        f"(nice {PRIORITY}, recorded with each ratio)."
    )


def ratio_text(summary: Dict[str, float | int | bool]) -> str:
    """``1.83x [1.71, 1.95]``, and ``(wide)`` when the interval is, ``(busy)`` when other work took
    the cores it needed (:mod:`unitrain.host.contention`)."""
    text = f"{summary['median']:.2f}x [{summary['low']:.2f}, {summary['high']:.2f}]"
    return text + (" (wide)" if summary["wide"] else "") + (" (busy)" if summary.get("busy") else "")
