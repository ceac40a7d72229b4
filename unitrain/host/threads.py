"""CPU thread counts, set identically for every framework so that comparisons are fair."""

from __future__ import annotations

import os

from unitrain.errors import ConfigError

#: Loader worker processes per core beyond which they only contend.
MAX_WORKERS_PER_CORE = 4


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_threads(threads: int | None, procs_per_node: int = 1) -> int:
    """``trainer.threads``, or this process's share of the cores when it is unset.

    Workers on one node split the cores between them: 2 workers x 2 threads on 2 cores would
    oversubscribe and measure contention, not the frameworks.
    """
    return threads or max(1, available_cores() // procs_per_node)


def export_threads(threads: int) -> None:
    """Export the count for OpenMP/MKL, which read it once when a framework loads.

    Paddle and torch default to different counts, which would compare thread pools rather than
    frameworks; each backend also sets it through its own API.
    """
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


def check_loader_workers(workers: int) -> None:
    """data.num_workers for this machine's cores: each worker is a process with its own copy of
    the framework's loader state, and beyond a few per core they only take memory and contend."""
    cores = available_cores()
    if workers > MAX_WORKERS_PER_CORE * cores:
        raise ConfigError(
            "data.num_workers",
            workers,
            f"at most {MAX_WORKERS_PER_CORE * cores} ({MAX_WORKERS_PER_CORE} per core of the {cores} here)",
        )
