"""Hugging Face checkpoints (``model=hf``): what ``backends/<name>/hf.py`` provides. The
framework-free rest (config.json read into an :class:`~unitrain.spec.hf.HfSpec`, the names and
shapes it implies, the safetensors weights as float32 NumPy) is :mod:`unitrain.spec.hf`'s."""

from __future__ import annotations

from typing import Any, Dict, List, Protocol, cast

import numpy as np

from unitrain.interface import modules
from unitrain.spec.hf import HfSpec


class HfModule(Protocol):
    def build_hf(self, spec: HfSpec, weights: Dict[str, np.ndarray]) -> Any:
        """The framework's causal language model for ``spec``, holding ``weights`` (the
        checkpoint's names, torch's layouts, float32): int64 token ids [batch, time] in, float32
        logits [batch, time, vocab_size] out. torch: transformers' own class; Paddle: unitrain's."""

    def hf_state(self, model: Any) -> Dict[str, np.ndarray]:
        """``model``'s parameters by the checkpoint's names in torch's layouts (a tied head left
        out): what :func:`build_hf` took, as it is now."""

    def hf_linear_weights(self, model: Any) -> List[str]:
        """The state names of ``model``'s own Linear weights (whose layout differs between the
        frameworks; GPT-2's Conv1D weights are [in, out] in both)."""


def hf_module(backend: str) -> HfModule:
    return cast(HfModule, modules.load(backend, "hf"))
