"""What Paddle cannot do of a unitrain config, said before anything starts (no paddle import)."""

from __future__ import annotations

from typing import Any

from unitrain.config.schema import DistConfig
from unitrain.errors import ConfigError

__all__ = ["check", "check_all_reduce"]


def check(cfg: Any) -> None:
    if cfg.amp.impl == "apex":
        raise ConfigError("amp.impl", "apex", "native with backend=paddle (NVIDIA Apex is a PyTorch extension)")
    check_all_reduce(cfg.dist)


def check_all_reduce(dist: DistConfig) -> None:
    if dist.grad_compression != "none":
        # fp16_allreduce and DGC in DistributedStrategy are static-graph meta-optimizers; the
        # dynamic graph's DataParallel all-reduces gradients in their own dtype, with no hook.
        raise ConfigError(
            "dist.grad_compression",
            dist.grad_compression,
            "none with backend=paddle: Paddle's dynamic-graph DataParallel has no gradient compression",
        )
    if dist.bucket_cap_mb is not None and dist.bucket_cap_mb != int(dist.bucket_cap_mb):
        raise ConfigError(
            "dist.bucket_cap_mb",
            dist.bucket_cap_mb,
            "a whole number of MB with backend=paddle (Fleet's fuse_grad_size_in_MB is an integer)",
        )
