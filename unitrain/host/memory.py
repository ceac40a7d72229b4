"""This machine's memory: how much is free, and whether an error a framework raised means it ran out."""

from __future__ import annotations

import re
import resource
from typing import Optional

from unitrain.errors import ConfigError

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


def check_fits(image_size: int, batch_size: int, num_classes: int, feature_dim: Optional[int]) -> None:
    """A batch of float32 RGB images, or a classifier of ``feature_dim`` features (a built-in
    model's), that alone would not fit in this machine's free memory, said before it is tried
    (the framework's own error would blame something else)."""
    free = available_mb()
    if free is None:
        return
    if batch_size * 12 * image_size**2 / 2**20 > free:
        most = int((free * 2**20 / (12 * batch_size)) ** 0.5)
        raise ConfigError(
            "data.image_size",
            image_size,
            f"at most {most}: one batch of trainer.batch_size={batch_size} such images alone would need more than "
            f"the {free / 1024:.1f} GiB free here",
        )
    if feature_dim is None:
        return
    # Weights, their gradients and momentum, and the batch's logits with their gradients.
    per_class_mb = 4 * (3 * feature_dim + 2 * batch_size) / 2**20
    if num_classes * per_class_mb > free:
        raise ConfigError(
            "data.num_classes",
            num_classes,
            f"at most {int(free / per_class_mb)}: its classifier alone would need "
            f"{num_classes * per_class_mb / 1024:.1f} GiB, more than the {free / 1024:.1f} GiB free here",
        )
