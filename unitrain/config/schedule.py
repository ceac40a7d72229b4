"""Batch sizes and learning rates: how the configured batch maps onto devices and steps.

Pure functions of the config, so both backends follow one curve.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from unitrain.config.schema import OptimConfig, UnitrainConfig


@dataclass(frozen=True)
class BatchPlan:
    micro_batch: int  # samples per device in one forward/backward
    accumulate_steps: int
    world_size: int
    global_batch: int  # samples per optimizer step, all devices together
    lr: float  # base learning rate after scaling

    @classmethod
    def from_config(cls, cfg: UnitrainConfig, world_size: int) -> "BatchPlan":
        """``optim.lr_scaling=linear`` keeps the per-device batch and scales the lr with the
        global batch (Goyal et al.); ``keep_global`` splits the global batch and keeps the lr."""
        accumulate = cfg.trainer.accumulate_steps
        factor = world_size * accumulate
        micro = cls.micro_batch_of(cfg, world_size)
        lr = cfg.optim.lr * factor if cfg.optim.lr_scaling == "linear" else cfg.optim.lr
        return cls(micro, accumulate, world_size, micro * factor, lr)

    @staticmethod
    def micro_batch_of(cfg, world_size: int) -> int:
        if cfg.optim.lr_scaling == "linear":
            return cfg.trainer.batch_size
        return cfg.trainer.batch_size // (world_size * cfg.trainer.accumulate_steps)

    def describe(self) -> dict:
        return asdict(self)


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
        floor = base * cfg.min_lr_ratio
        return floor + 0.5 * (base - floor) * (1 + math.cos(math.pi * min(after, span) / span))
    raise ValueError(f"unknown schedule {cfg.schedule!r}")
