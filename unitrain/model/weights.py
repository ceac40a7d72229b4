"""Model weights between frameworks, as NumPy, through one canonical layout (PyTorch's names and
layouts). Each backend's ``weights.py`` says how its own state differs from the canonical one;
no framework is imported to convert."""

from __future__ import annotations

from typing import Any, Dict, Iterable

import numpy as np

from unitrain.errors import UnitrainError
from unitrain.interface.weights import weights_module

Arrays = Dict[str, np.ndarray]


def to_canonical(framework: str, arrays: Arrays) -> Arrays:
    return weights_module(framework).to_canonical(arrays)


def from_canonical(framework: str, arrays: Arrays) -> Arrays:
    return weights_module(framework).from_canonical(arrays)


def convert(arrays: Arrays, source: str, target: str) -> Arrays:
    """``source``'s state as ``target``'s, exactly."""
    return from_canonical(target, to_canonical(source, arrays))


def check_state(names: Iterable[str], shapes: Dict[str, tuple], arrays: Dict[str, Any]) -> None:
    """One line naming what does not fit, before a framework half-loads a state."""
    names = list(names)
    missing, unexpected = sorted(set(names) - set(arrays)), sorted(set(arrays) - set(names))
    if missing or unexpected:

        def some(keys: list) -> str:
            return ", ".join(keys[:3]) + ("..." if len(keys) > 3 else "")

        raise UnitrainError(
            f"the weights do not fit this model: {len(missing)} missing ({some(missing)}), {len(unexpected)} "
            f"unexpected ({some(unexpected)})"
        )
    wrong = [f"{k} {tuple(arrays[k].shape)} vs {shapes[k]}" for k in names if tuple(arrays[k].shape) != shapes[k]]
    if wrong:
        raise UnitrainError(
            f"the weights do not fit this model: shapes differ for {len(wrong)} tensor(s), e.g. {wrong[0]}"
        )
