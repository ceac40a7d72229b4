"""This machine's memory: how much is free, and whether an error a framework raised means it ran out."""

from __future__ import annotations

import re
import resource
from typing import Optional

# The frameworks' out-of-memory errors: torch.OutOfMemoryError / "CUDA out of memory" / its CPU
# allocator's "can't allocate memory", Paddle's ResourceExhausted ("Out of memory error on GPU"),
# and the C++ allocators' std::bad_alloc.
OOM_PATTERNS = re.compile(
    r"out of memory|OutOfMemoryError|ResourceExhausted|can't allocate memory|std::bad_alloc", re.IGNORECASE
)


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, MemoryError) or bool(OOM_PATTERNS.search(f"{type(err).__name__}: {err}"))


def available_mb() -> Optional[float]:
    """Memory the kernel says can be given to a new process without swapping (Linux), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss_mb() -> float:
    """This process's peak resident memory so far."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux
