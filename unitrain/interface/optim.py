"""The optimizers of collective jobs (spec.optimizers.COLLECTIVE) in the framework: what
``backends/<name>/optim.py`` provides, and the one rule both follow for which parameters decay
(docs/optimizers.md)."""

from __future__ import annotations

from typing import Any, Collection, Mapping, Optional, Protocol, Sequence, TypeVar, cast

from unitrain.config.schema import OptimConfig
from unitrain.errors import ConfigError
from unitrain.interface import modules
from unitrain.spec import optimizers

Rule = TypeVar("Rule")


class OptimModule(Protocol):
    def build_optimizer(self, model: Any, cfg: OptimConfig) -> Any: ...

    def set_lr(self, optimizer: Any, lr: float) -> None: ...

    def nonfinite_state(self, optimizer: Any) -> Optional[str]:
        """The name of the first optimizer state (momentum buffer...) holding nan or inf, or None."""


#: spec.optimizers.COLLECTIVE, for jobs/collective.py and train/parity.py until they read it there.


def rule_of(rules: Mapping[str, Rule], name: Any) -> Rule:
    """A backend's builder for ``optim.name`` (``rules``: its builders, checked against
    spec.optimizers.COLLECTIVE by ``optimizers.implemented``); a name no backend builds (a
    parameter-server rule, from a library user who skipped validation) is one line."""
    if str(name) not in optimizers.COLLECTIVE:
        raise ConfigError(
            "optim.name", str(name), f"one of {', '.join(optimizers.COLLECTIVE)} (the optimizers of collective jobs)"
        )
    return rules[str(name)]


def decays(name: str, shape: Sequence[int], embeddings: Collection[str] = ()) -> bool:
    """Whether ``optim.decay_norm_and_bias=false`` still decays this parameter: only the conv
    and linear weights do. Normalisation scales and shifts and biases are 1-D; an Embedding's
    table is 2-D like a Linear's weight, so each backend names its Embedding layers' weights
    (``embeddings``, found by the framework's Embedding type). The same rule on both
    frameworks, whose parameter names line up."""
    return len(shape) > 1 and name not in embeddings


def optim_module(backend: str) -> OptimModule:
    return cast(OptimModule, modules.load(backend, "optim"))
