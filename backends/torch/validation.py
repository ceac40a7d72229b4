"""What PyTorch cannot do of a unitrain config, said before anything starts (no torch import)."""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from typing import Set

from unitrain.config.schema import DistConfig, UnitrainConfig
from unitrain.errors import ConfigError
from unitrain.host import machine
from unitrain.spec.models import MODELS, ResNetSpec

APEX_HELP = (
    "amp.impl=apex needs NVIDIA Apex built from source with its amp module (apex.amp was removed in 2025 by "
    "NVIDIA/apex PR #1896; tag 25.04 is the last that has it: git clone -b 25.04 https://github.com/NVIDIA/apex "
    "and pip install -v --no-build-isolation ./apex); the PyPI package named 'apex' is unrelated. "
    "Or use amp.impl=native, which gives the same levels without Apex"
)

log = logging.getLogger("unitrain")
_warned: Set[str] = set()  # validate() runs before Hydra and again inside it: say it once

__all__ = ["check_all_reduce", "check_collective", "check_ps"]


def check_collective(cfg: UnitrainConfig) -> None:
    if cfg.amp.impl == "apex" and cfg.amp.level != "O0" and importlib.util.find_spec("apex") is None:
        raise ConfigError("amp.impl", "apex", f"native here: NVIDIA Apex is not installed; {APEX_HELP}")
    check_all_reduce(cfg.dist)
    _warn_of_onednn_bf16_on_one_pixel(cfg)


def check_ps(cfg: UnitrainConfig) -> None:
    if cfg.dist.ps.sync == "geo":
        raise ConfigError(
            "dist.ps.sync",
            "geo",
            "sync or async with backend=torch (geo-SGD is Paddle's; torch.distributed.rpc has no counterpart)",
        )
    if cfg.dist.ps.merge_pushes != 1:
        raise ConfigError(
            "dist.ps.merge_pushes",
            cfg.dist.ps.merge_pushes,
            "1 with backend=torch (its servers apply each trainer's push as it arrives; summing several steps' "
            "pushes into one update is Fleet's client)",
        )
    if cfg.dist.ps.feed == "engine":
        raise ConfigError(
            "dist.ps.feed",
            "engine",
            "steps with backend=torch (torch has no engine that runs whole passes over files; its DataLoader "
            "workers already read them: data.num_workers)",
        )
    check_all_reduce(cfg.dist)


def _warn_of_onednn_bf16_on_one_pixel(cfg: UnitrainConfig) -> None:
    """oneDNN's bf16 convolution backward (torch's on AVX-512 CPUs) returns non-finite weight
    gradients, at random, for a stride-2 3x3 convolution whose input is one pixel (benchmarks/README.md,
    "oneDNN bf16 NaN"); a ResNet's layer4 sees one at data.image_size <= 16. The run then stops with a NaN
    loss that lowering the learning rate does not cure."""
    amp, isa = cfg.amp, os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    extensions = machine.cpu()["extensions"] or []
    if amp.level == "O0" or amp.dtype != "bfloat16" or "avx512f" not in extensions or isa.startswith(("AVX2", "SSE")):
        return
    spec = MODELS.get(cfg.model.name) if cfg.model.name in MODELS else None
    if not isinstance(spec, ResNetSpec) or cfg.backend.device not in ("auto", "cpu"):
        return
    stem = spec.stem_layers
    layer4_input = math.ceil(cfg.data.image_size / (stem.stride * (2 if stem.max_pool else 1)) / 4)
    message = (
        f"data.image_size={cfg.data.image_size} leaves {cfg.model.name}'s layer4 a 1x1 input, on which torch's oneDNN "
        "bf16 convolution backward gives non-finite gradients at random on this AVX-512 CPU: the run may stop with "
        "a NaN loss that is not the learning rate's; use data.image_size >= 32 or ONEDNN_MAX_CPU_ISA=AVX2"
    )
    if layer4_input <= 1 and message not in _warned:
        _warned.add(message)
        log.warning(message)


def check_all_reduce(dist: DistConfig) -> None:
    """torch offers every lever of the schema; which compression its communication library
    takes (bf16 needs NCCL) is known only once the device is, in the distributed context."""
