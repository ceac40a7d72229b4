"""Paddle's parameter names and layouts against the canonical (PyTorch's) ones; no paddle import
until a file is written.

Paddle and PyTorch name the ResNet parameters unitrain builds the same way, except that
Paddle's BatchNorm statistics are ``_mean``/``_variance`` (``running_mean``/``running_var``)
and its Linear weights are stored [in, out] (PyTorch: [out, in]). PyTorch also counts
``num_batches_tracked`` per BatchNorm, which Paddle has no counterpart for; it only matters
when BatchNorm's momentum is None, which unitrain never uses, so it is set to 0 on the way in
and dropped on the way out. Every other value round-trips bit for bit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

import numpy as np

__all__ = ["LINEAR_IN_OUT", "NATIVE_SUFFIX", "canonical_name", "from_canonical", "save_native", "to_canonical"]

Arrays = Dict[str, np.ndarray]
NATIVE_SUFFIX = ".pdparams"
LINEAR_IN_OUT = True  # paddle.nn.Linear's weight is [in, out]
_PADDLE_TO_TORCH_SUFFIX = {"._mean": ".running_mean", "._variance": ".running_var"}


def canonical_name(name: str) -> str:
    for old, new in _PADDLE_TO_TORCH_SUFFIX.items():
        if name.endswith(old):
            return name[: -len(old)] + new
    return name


#: The built-in GPTs' embeddings: 2-D weights laid out alike in both frameworks ([rows, width]).
_EMBEDDINGS = ("wte.weight", "wpe.weight")


def _is_linear_weight(name: str, array: np.ndarray) -> bool:
    # In the built-in models (ResNets, ViTs, GPTs), 2-D weights other than the GPTs' embeddings are
    # exactly the Linear ones (convolutions are 4-D, the ViT's tokens 3-D); a user's pair records
    # its Linear weights (unitrain.model.pairing).
    return name.endswith(".weight") and array.ndim == 2 and not name.endswith(_EMBEDDINGS)


def to_canonical(arrays: Arrays) -> Arrays:
    out: Arrays = {}
    for name, array in arrays.items():
        name = canonical_name(name)
        if name.endswith(".running_var"):
            out[name[: -len(".running_var")] + ".num_batches_tracked"] = np.array(0, dtype=np.int64)
        out[name] = np.ascontiguousarray(array.T) if _is_linear_weight(name, array) else array
    return out


def from_canonical(arrays: Arrays) -> Arrays:
    out: Arrays = {}
    for name, array in arrays.items():
        if name.endswith(".num_batches_tracked"):
            continue
        for old, new in _PADDLE_TO_TORCH_SUFFIX.items():
            if name.endswith(new):
                name = name[: -len(new)] + old
        out[name] = np.ascontiguousarray(array.T) if _is_linear_weight(name, array) else array
    return out


def save_native(arrays: Arrays, path: Path) -> None:
    """A ``.pdparams`` file: ``layer.set_state_dict(paddle.load(path))`` loads it."""
    import paddle

    tmp = path.with_name(f".{path.name}.tmp")
    try:
        paddle.save({k: paddle.to_tensor(v) for k, v in arrays.items()}, str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
