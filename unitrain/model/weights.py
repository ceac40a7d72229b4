"""Model state between frameworks, as NumPy: the canonical layout is PyTorch's.

Paddle and PyTorch name the ResNet parameters unitrain builds the same way, except that
Paddle's BatchNorm statistics are ``_mean``/``_variance`` (``running_mean``/``running_var``)
and its Linear weights are stored [in, out] (PyTorch: [out, in]). PyTorch also counts
``num_batches_tracked`` per BatchNorm, which Paddle has no counterpart for; it only matters
when BatchNorm's momentum is None, which unitrain never uses, so it is set to 0 on the way in
and dropped on the way out. Every other value round-trips bit for bit.
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from unitrain.errors import UnitrainError

Arrays = Dict[str, np.ndarray]
FRAMEWORKS = ("paddle", "torch")
_PADDLE_TO_TORCH_SUFFIX = {"._mean": ".running_mean", "._variance": ".running_var"}


def _is_linear_weight(name: str, array: np.ndarray) -> bool:
    # In the ResNets, 2-D weights are exactly the Linear ones (conv weights are 4-D).
    return name.endswith(".weight") and array.ndim == 2


def to_canonical(framework: str, arrays: Arrays) -> Arrays:
    if framework == "torch":
        return dict(arrays)
    if framework != "paddle":
        raise UnitrainError(f"unknown framework {framework!r}; available: {', '.join(FRAMEWORKS)}")
    out: Arrays = {}
    for name, array in arrays.items():
        for old, new in _PADDLE_TO_TORCH_SUFFIX.items():
            if name.endswith(old):
                name = name[: -len(old)] + new
                if new == ".running_var":
                    out[name[: -len(new)] + ".num_batches_tracked"] = np.array(0, dtype=np.int64)
        out[name] = np.ascontiguousarray(array.T) if _is_linear_weight(name, array) else array
    return out


def from_canonical(framework: str, arrays: Arrays) -> Arrays:
    if framework == "torch":
        return dict(arrays)
    if framework != "paddle":
        raise UnitrainError(f"unknown framework {framework!r}; available: {', '.join(FRAMEWORKS)}")
    out: Arrays = {}
    for name, array in arrays.items():
        if name.endswith(".num_batches_tracked"):
            continue
        for old, new in _PADDLE_TO_TORCH_SUFFIX.items():
            if name.endswith(new):
                name = name[: -len(new)] + old
        out[name] = np.ascontiguousarray(array.T) if _is_linear_weight(name, array) else array
    return out


def convert(arrays: Arrays, source: str, target: str) -> Arrays:
    return from_canonical(target, to_canonical(source, arrays))
