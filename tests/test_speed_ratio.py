"""Speed ratios as interleaved pairs: the blocks alternate, each pair is one ratio, and the claim
is the median with its 95% interval (the suite never asserts a timing, only the method)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from typing import List

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from unitrain.deploy.speed_ratio import interleave
from unitrain.host import contention
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


def test_other_work_on_the_machine_is_measured_and_flagged():
    """Two spinning processes at the default priority beside this one: the CPU they took is
    counted (this process's own is not), and a 2-thread timing on this machine is flagged busy."""
    spin = [sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"]
    hogs = [subprocess.Popen(spin) for _ in range(2)]
    try:
        time.sleep(0.3)
        start = contention.sample()
        time.sleep(1.0)
        others = contention.other_cpus(start, contention.sample())
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    cpus = os.cpu_count()
    assert others is not None and others > min(2, cpus) - 0.5
    assert contention.busy(others, cpus, threads=cpus) and not contention.busy(0.0, cpus, threads=cpus)


def test_the_timing_process_runs_at_the_raised_priority_where_allowed():
    allowed = os.geteuid() == 0
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
        preexec_fn=contention.raise_priority,
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(child.stdout) == (contention.PRIORITY if allowed else os.getpriority(os.PRIO_PROCESS, 0))


def test_the_interval_holds_what_differs_between_processes():
    """Two processes whose pairs agree closely within each but not between them (a compiled
    model's kernels differ from one process to the next): one process's interval misses the
    other's median, the interval over both levels holds both."""
    first, second = [8.55, 8.6, 8.62, 8.58, 8.6], [8.05, 8.1, 8.08, 8.12, 8.1]
    _, low, high = median_ci(first)
    assert not low <= 8.1 <= high
    summary = ratio_summary(first + second, groups=[first, second])
    assert summary["low"] <= 8.1 and 8.6 <= summary["high"] and summary["pairs"] == 10
