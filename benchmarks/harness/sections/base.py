"""What every section shares: the bench its jobs run on, and rows' medians with their spread."""

from __future__ import annotations

import statistics
from typing import Dict, Iterable, List

from unitrain.report.intervals import median_ci

from ..bench import Bench


class Section:
    """One table of results.md: measure() runs its jobs on the bench and returns its rows."""

    def __init__(self, bench: Bench):
        self.bench = bench
        self.quick = bench.quick

    def measure(self) -> List[Dict]:
        raise NotImplementedError


def say(line: str) -> None:
    # Flushed at once: a section runs for minutes, and its output is often a pipe or a log file.
    print(line, flush=True)


def with_ci(key: str, values: List[float]) -> Dict:
    """``key``: the median; ``key_ci``: its bootstrap 95% interval."""
    median, low, high = median_ci(values)
    return {key: median, f"{key}_ci": [low, high]}


def with_spread(key: str, values: Iterable[float]) -> Dict:
    """``key``: the median; ``key_min`` and ``key_max``: the range over repeats."""
    values = list(values)
    return {key: statistics.median(values), f"{key}_min": min(values), f"{key}_max": max(values)}
