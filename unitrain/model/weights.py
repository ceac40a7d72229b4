"""Model weights between frameworks, as NumPy, through one canonical layout (PyTorch's names and
layouts). Each backend's ``weights.py`` says how its own state differs from the canonical one;
no framework is imported to convert."""

from __future__ import annotations

from typing import Dict

import numpy as np

from unitrain.interface.weights import weights_module

Arrays = Dict[str, np.ndarray]


def to_canonical(framework: str, arrays: Arrays) -> Arrays:
    return weights_module(framework).to_canonical(arrays)


def from_canonical(framework: str, arrays: Arrays) -> Arrays:
    return weights_module(framework).from_canonical(arrays)


def convert(arrays: Arrays, source: str, target: str) -> Arrays:
    """``source``'s state as ``target``'s, exactly."""
    return from_canonical(target, to_canonical(source, arrays))
