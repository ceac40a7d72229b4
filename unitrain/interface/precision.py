"""MixedPrecision: how a step runs in reduced precision, and what precision really ran.

Shaped like Lightning Fabric's precision plugins: every method has a full-precision default
(level O0), and a backend's subclass overrides only what its AMP needs. The defaults use only
methods both frameworks share (``loss.backward()``, ``optimizer.step()``), so O0 is complete
for any backend with this class alone.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Dict, FrozenSet, Protocol, Tuple, cast

from unitrain.config.schema import AmpConfig
from unitrain.errors import ConfigError
from unitrain.interface import modules

# Op names for amp.custom_white_list / amp.custom_black_list, the same on both backends
# (each maps them to its own: paddle op types, torch module classes).
OP_NAMES = (
    "conv2d",
    "linear",
    "batch_norm",
    "relu",
    "max_pool2d",
    "adaptive_avg_pool2d",
    "softmax",
    "layer_norm",
    "gelu",
)
# O1's defaults, Paddle's semantics: matmul-like ops in low precision, softmax in fp32. The loss
# is computed in fp32 at every level (the backends' loss() upcasts the logits).
DEFAULT_WHITE_LIST = frozenset({"conv2d", "linear"})
DEFAULT_BLACK_LIST = frozenset({"softmax"})


def op_lists(cfg: AmpConfig) -> Tuple[FrozenSet[str], FrozenSet[str]]:
    """(white, black) for O1: the defaults with the custom lists on top (a custom entry wins)."""
    for key, names in (
        ("amp.custom_white_list", cfg.custom_white_list),
        ("amp.custom_black_list", cfg.custom_black_list),
    ):
        for name in names:
            if name not in OP_NAMES:
                raise ConfigError(key, list(names), f"op names from {', '.join(OP_NAMES)}")
    custom_white, custom_black = frozenset(cfg.custom_white_list), frozenset(cfg.custom_black_list)
    if custom_white & custom_black:
        raise ConfigError(
            "amp.custom_black_list",
            sorted(custom_black),
            f"no op also on amp.custom_white_list ({', '.join(sorted(custom_white & custom_black))})",
        )
    return (DEFAULT_WHITE_LIST - custom_black) | custom_white, (DEFAULT_BLACK_LIST - custom_white) | custom_black


def loss_scaling_wanted(cfg: AmpConfig) -> bool:
    """Dynamic loss scaling: on for float16 (narrow range), off for bfloat16, unless set."""
    if cfg.level == "O0":
        return False
    return cfg.dtype == "float16" if cfg.use_dynamic_loss_scaling is None else cfg.use_dynamic_loss_scaling


class MixedPrecision:
    def __init__(self, cfg: AmpConfig | None = None):
        self.cfg = cfg or AmpConfig()
        # Why the effective precision differs from the requested one, if it does.
        self.fallback_reason: str | None = None

    @property
    def level(self) -> str:
        return self.cfg.level

    @property
    def dtype(self) -> str:
        return "float32" if self.level == "O0" else self.cfg.dtype

    @property
    def requested(self) -> str:
        return "O0 float32" if self.level == "O0" else f"{self.level} {self.cfg.dtype}"

    @property
    def effective(self) -> str:
        """The precision that really ran, e.g. ``"fp32"`` or ``"O1 bfloat16"``; never the wish alone."""
        return "fp32"

    def decorate(self, model: Any, optimizer: Any) -> Tuple[Any, Any]:
        """Cast parameters / attach master weights as the level requires."""
        return model, optimizer

    def convert_input(self, data: Any) -> Any:
        """Cast a batch of inputs as the level requires (O3 feeds the model low precision)."""
        return data

    def autocast(self) -> ContextManager[None]:
        """Context for the forward pass and loss."""
        return contextlib.nullcontext()

    def backward(self, loss: Any) -> None:
        loss.backward()

    def step(self, optimizer: Any) -> bool:
        """Step the optimizer; returns False when the step was skipped (inf/nan gradients)."""
        optimizer.step()
        return True

    def metrics(self) -> Dict[str, float]:
        """Per-step values worth logging (loss_scale, skipped_steps) once scaling exists."""
        return {}

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        pass

    def describe(self) -> Dict[str, Any]:
        return {
            "requested": self.requested,
            "effective": self.effective,
            "impl": self.cfg.impl,
            "fallback_reason": self.fallback_reason,
            **self.metrics(),
        }


class ScaledMixedPrecision(MixedPrecision):
    """Bookkeeping shared by backends whose precision owns a framework GradScaler.

    Both paddle.amp.GradScaler and torch.amp.GradScaler have state_dict/load_state_dict; a
    subclass creates ``self.scaler`` in ``decorate`` and says how to read the current scale.
    """

    def __init__(self, cfg: AmpConfig | None = None):
        super().__init__(cfg)
        self.scaler: Any = None
        self.skipped_steps = 0

    def loss_scale(self) -> float:
        raise NotImplementedError

    def metrics(self) -> Dict[str, float]:
        if self.scaler is None:
            return {}
        return {"loss_scale": self.loss_scale(), "skipped_steps": self.skipped_steps}

    def state_dict(self) -> Dict[str, Any]:
        return {"scaler": self.scaler.state_dict() if self.scaler else {}, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = state.get("skipped_steps", 0)


class PrecisionModule(Protocol):
    """What ``backends/<name>/precision.py`` provides."""

    def make_precision(self, cfg: AmpConfig) -> MixedPrecision:
        """The framework's MixedPrecision for ``cfg`` (its AMP, or Apex where asked)."""


def precision_module(backend: str) -> PrecisionModule:
    return cast(PrecisionModule, modules.load(backend, "precision"))
