"""Inference mode for evaluation in torch: running BatchNorm statistics, no autograd graph."""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import torch

__all__ = ["inference", "predict"]


@contextlib.contextmanager
def inference(model: torch.nn.Module) -> Iterator[None]:
    """``model.eval()`` under ``torch.no_grad()``; the caller puts the model back in training mode."""
    model.eval()
    with torch.no_grad():
        yield


def predict(model: torch.nn.Module, images: np.ndarray) -> np.ndarray:
    with inference(model):
        return model(torch.from_numpy(images)).float().cpu().numpy()
