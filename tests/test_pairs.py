"""Speed ratios as interleaved pairs: the blocks alternate, each pair is one ratio, and the claim
is the median with its 95% interval (the suite never asserts a timing, only the method)."""

from __future__ import annotations

import itertools
from typing import List

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from unitrain.deploy.pairs import interleave
from unitrain.interface.infer import Runtime
from unitrain.report.intervals import median_ci, ratio_summary, ratio_text


class Recording(Runtime):
    """A runtime that only records when it ran."""

    def __init__(self, name: str, log: List[str]):
        super().__init__(path=None, threads=1)
        self.name, self.log = name, log

    def run(self, prepared):
        self.log.append(self.name)
        return np.zeros(1)


def test_blocks_alternate_and_each_pair_is_one_ratio():
    log: List[str] = []
    runtimes = [Recording("reference", log), Recording("candidate", log)]
    measured = interleave(runtimes, [None, None], pairs=4, warmup=2)
    assert len(measured["ratios"]) == 4
    assert measured["ratios"] == [a / b for a, b in zip(measured["reference_s"], measured["candidate_s"])]
    runs = [(name, len(list(group))) for name, group in itertools.groupby(log)]
    # Two warm-up runs of each, one run of each to size the blocks, then blocks of n runs:
    # reference first in even pairs, last in odd ones (so adjacent blocks of one model merge).
    n = runs[4][1]
    r, c = "reference", "candidate"
    assert runs == [(r, 2), (c, 2), (r, 1), (c, 1), (r, n), (c, 2 * n), (r, 2 * n), (c, 2 * n), (r, n)]


@given(st.lists(st.floats(0.1, 10), min_size=2, max_size=40))
def test_the_interval_holds_the_median(ratios):
    median, low, high = median_ci(ratios)
    assert low <= median <= high and min(ratios) <= low and high <= max(ratios)
    summary = ratio_summary(ratios)
    assert summary["pairs"] == len(ratios) and summary["wide"] == (high - low > 0.25 * median)
    assert ratio_text(summary).startswith(f"{median:.2f}x [{low:.2f}, {high:.2f}]")
