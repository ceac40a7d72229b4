"""Learning-rate schedules as pure functions of the step, so both backends follow one curve."""

from __future__ import annotations

import math

from unitrain.config import OptimConfig


def lr_at(step: int, total_steps: int, cfg: OptimConfig, base_lr: float | None = None) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warm-up, then the schedule."""
    base = cfg.lr if base_lr is None else base_lr
    if step < cfg.warmup_steps:
        return base * (step + 1) / cfg.warmup_steps
    after = step - cfg.warmup_steps
    if cfg.schedule == "constant":
        return base
    if cfg.schedule == "step":
        return base * cfg.gamma ** (after // cfg.step_size)
    if cfg.schedule == "cosine":
        span = max(1, total_steps - cfg.warmup_steps)
        return 0.5 * base * (1 + math.cos(math.pi * min(after, span) / span))
    raise ValueError(f"unknown schedule {cfg.schedule!r}")
