"""MixedPrecision: how a step runs in reduced precision, and what precision really ran.

Shaped like Lightning Fabric's precision plugins: every method has a full-precision default
(level O0), and a backend's subclass overrides only what its AMP needs. The defaults use only
methods both frameworks share (``loss.backward()``, ``optimizer.step()``), so O0 is complete
for any backend with this class alone.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Dict, Tuple

from unitrain.config import AmpConfig


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
        }
