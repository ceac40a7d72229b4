"""Inference mode for held-out evaluation and export checks: what ``backends/<name>/evaluation.py``
provides. Loss and accuracy are computed in the core (:mod:`unitrain.train.evaluation`)."""

from __future__ import annotations

from typing import Any, ContextManager, Protocol, cast

import numpy as np

from unitrain.interface import modules


class EvaluationModule(Protocol):
    def inference(self, model: Any) -> ContextManager[None]:
        """The model in inference mode (running BatchNorm statistics, no autograd) inside."""

    def predict(self, model: Any, images: np.ndarray) -> np.ndarray:
        """Logits of ``model`` in inference mode for a NumPy batch, as float32 NumPy."""


def evaluation_module(backend: str) -> EvaluationModule:
    return cast(EvaluationModule, modules.load(backend, "evaluation"))
