"""What PyTorch cannot do of a unitrain config, said before anything starts (no torch import)."""

from __future__ import annotations

from typing import Any

from unitrain.config.schema import DistConfig
from unitrain.errors import ConfigError

__all__ = ["check", "check_all_reduce"]


def check(cfg: Any) -> None:
    if cfg.dist.mode == "ps" and cfg.dist.ps.sync == "geo":
        raise ConfigError(
            "dist.ps.sync",
            "geo",
            "sync or async with backend=torch (geo-SGD is Paddle's; torch.distributed.rpc has no counterpart)",
        )
    check_all_reduce(cfg.dist)


def check_all_reduce(dist: DistConfig) -> None:
    """torch offers every lever of the schema; which compression its communication library
    takes (bf16 needs NCCL) is known only once the device is, in the distributed context."""
