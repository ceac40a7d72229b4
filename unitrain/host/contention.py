"""Other work on the machine while something is timed: kept out where the system allows it,
measured where it does not.

A speed ratio is measured with every thread the run asks for. When other processes want the same
cores, the scheduler takes one of those threads off its core now and then, and a multi-threaded
kernel waits at its next barrier for it. A model of many small kernels (int8) meets many more
barriers than one of few large kernels, so a busy machine changes the ratio itself, not only its
spread, and interleaving the two models cannot undo that. The process that times therefore runs
at a raised scheduling priority when it may (root, or CAP_SYS_NICE), and records how much CPU the
other processes got while it measured, so that a ratio timed beside other work says so.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional

#: The nice value a timing process asks for: the scheduler then gives its threads about 28 times
#: the share of a process at the default 0, so other work rarely takes their cores.
PRIORITY = -15
#: CPUs of other work beyond the cores a timing left free that mark it as timed on a busy machine.
#: Raised priority keeps the cores, not the caches and memory bandwidth they share: with a
#: quarter of a CPU taken by other work, ratios were seen to move by a few percent.
BUSY_CPUS = 0.25
_FIELDS_BUSY = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal of /proc/stat's cpu line


def raise_priority() -> int:
    """Ask for :data:`PRIORITY` for this process (threads started later inherit it); its nice
    value after, unchanged where the system refuses. Usable in a subprocess ``preexec_fn``."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, PRIORITY)
    except OSError:
        pass
    return os.getpriority(os.PRIO_PROCESS, 0)


@dataclass(frozen=True, kw_only=True)
class CpuSample:
    """Wall time, CPU seconds every core has been busy since boot (None off Linux) and this
    process's CPU seconds, all its threads."""

    wall_s: float
    busy_s: Optional[float]
    own_s: float


def sample() -> CpuSample:
    busy = None
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        busy = sum(fields[i] for i in _FIELDS_BUSY if i < len(fields)) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        pass
    times = os.times()
    return CpuSample(wall_s=time.monotonic(), busy_s=busy, own_s=times.user + times.system)


def other_cpus(start: CpuSample, end: CpuSample) -> Optional[float]:
    """How many CPUs other processes kept busy on average between two samples (None: unknown)."""
    wall = end.wall_s - start.wall_s
    if start.busy_s is None or end.busy_s is None or wall <= 0:
        return None
    others = (end.busy_s - start.busy_s) - (end.own_s - start.own_s)
    return max(0.0, others / wall)


def busy(others: Optional[float], cpus: Optional[int], threads: int) -> bool:
    """Whether other work took more than the cores a timing with ``threads`` threads left free."""
    if others is None or not cpus:
        return False
    return others > max(0, cpus - threads) + BUSY_CPUS
