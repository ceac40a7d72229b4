"""MixedPrecision for torch (torch.amp; Apex where installed)."""

from __future__ import annotations

from unitrain.config import AmpConfig
from unitrain.errors import NotImplementedYetError
from unitrain.precision import MixedPrecision


def make_precision(cfg: AmpConfig) -> MixedPrecision:
    if cfg.level != "O0":
        raise NotImplementedYetError(
            f"amp={cfg.level} is not implemented yet on torch (issue #4, mixed precision); available now: amp=O0"
        )
    return MixedPrecision(cfg)
