"""Inference mode for evaluation in paddle: running BatchNorm statistics, no autograd graph."""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import paddle

__all__ = ["inference", "predict"]


@contextlib.contextmanager
def inference(model: paddle.nn.Layer) -> Iterator[None]:
    """``model.eval()`` under ``paddle.no_grad()``; the caller puts the model back in training mode."""
    model.eval()
    with paddle.no_grad():
        yield


def predict(model: paddle.nn.Layer, images: np.ndarray) -> np.ndarray:
    with inference(model):
        return model(paddle.to_tensor(images)).astype("float32").numpy()
