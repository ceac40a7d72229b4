"""PyTorch's parameter names and layouts are the canonical ones; no torch import until a file is written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

import numpy as np

__all__ = ["LINEAR_IN_OUT", "NATIVE_SUFFIX", "canonical_name", "from_canonical", "save_native", "to_canonical"]

Arrays = Dict[str, np.ndarray]
NATIVE_SUFFIX = ".pt"
LINEAR_IN_OUT = False  # torch.nn.Linear's weight is [out, in], the canonical layout


def canonical_name(name: str) -> str:
    return name


def to_canonical(arrays: Arrays) -> Arrays:
    return dict(arrays)


def from_canonical(arrays: Arrays) -> Arrays:
    return dict(arrays)


def save_native(arrays: Arrays, path: Path) -> None:
    """A state_dict file: ``model.load_state_dict(torch.load(path))`` loads it."""
    import torch

    tmp = path.with_name(f".{path.name}.tmp")
    try:
        torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
