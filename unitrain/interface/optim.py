"""The seed's optimizer (momentum SGD, L2 weight decay) in the framework: what
``backends/<name>/optim.py`` provides, and the one rule both follow for weight decay."""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence, cast

from unitrain.config.schema import OptimConfig
from unitrain.interface import modules


class OptimModule(Protocol):
    def build_optimizer(self, model: Any, cfg: OptimConfig) -> Any: ...

    def set_lr(self, optimizer: Any, lr: float) -> None: ...

    def nonfinite_state(self, optimizer: Any) -> Optional[str]:
        """The name of the first optimizer state (momentum buffer...) holding nan or inf, or None."""


def decays(name: str, shape: Sequence[int]) -> bool:
    """Whether ``optim.decay_norm_and_bias=false`` still decays this parameter: only the conv
    and linear weights do (BatchNorm scales and shifts and biases are 1-D); the same rule on
    both frameworks, whose parameter names line up."""
    return len(shape) > 1


def optim_module(backend: str) -> OptimModule:
    return cast(OptimModule, modules.load(backend, "optim"))
