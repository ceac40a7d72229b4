"""glibc's malloc thresholds, fixed for the job (``trainer.malloc``).

glibc adapts its mmap and trim thresholds to the sizes a process has freed so far. A training
step frees and reallocates the same activation buffers every step; depending on what the process
did before the loop, glibc either keeps that memory or hands it back to the kernel and faults it
in again, page by page, on the next step: the same step then costs more in one process than in
another (benchmarks/README.md, "glibc's malloc thresholds"). Fixing both thresholds makes the
step cost independent of the process's history, the same for both frameworks.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Dict

# mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
# Buffers up to this size come from the heap and are reused; larger ones (rare) are mmapped.
MMAP_THRESHOLD = 256 << 20
# Free memory at the top of the heap is kept up to this much rather than returned to the kernel.
TRIM_THRESHOLD = 1 << 30


def apply(mode: str) -> Dict[str, Any]:
    """Set the thresholds for ``mode`` and say what took effect (mallopt's answers, not the request)."""
    if mode == "dynamic":
        return {"mode": "dynamic", "applied": False}
    if not sys.platform.startswith("linux"):
        return {"mode": mode, "applied": False, "why": "glibc's mallopt exists only on Linux"}
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return {"mode": mode, "applied": False, "why": "not glibc (no mallopt)"}
    # mallopt returns 1 on success and 0 for a value this glibc refuses.
    applied = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return {"mode": mode, "applied": applied, "mmap_threshold": MMAP_THRESHOLD, "trim_threshold": TRIM_THRESHOLD}
