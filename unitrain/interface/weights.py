"""A framework's parameter names and layouts against the canonical ones: what
``backends/<name>/weights.py`` provides, without importing its framework.

The canonical layout is PyTorch's names and layouts; :mod:`unitrain.model.weights` converts
between any two backends through it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Protocol, cast

import numpy as np

from unitrain.interface import modules

Arrays = Dict[str, np.ndarray]


class WeightsModule(Protocol):
    #: The suffix of the framework's own weights file (``.pt``, ``.pdparams``).
    NATIVE_SUFFIX: str
    #: Whether the framework stores a Linear weight [in, out] (the canonical layout: [out, in]).
    LINEAR_IN_OUT: bool

    def canonical_name(self, name: str) -> str:
        """A parameter's or buffer's name as the canonical layout names it (BatchNorm's statistics)."""

    def to_canonical(self, arrays: Arrays) -> Arrays:
        """The framework's state as canonical arrays; every value round-trips bit for bit."""

    def from_canonical(self, arrays: Arrays) -> Arrays:
        """Canonical arrays as the framework's state (names and layouts it loads)."""

    def save_native(self, arrays: Arrays, path: Path) -> None:
        """The framework's own weights file, loadable without unitrain; written whole or not at all."""


def weights_module(backend: str) -> WeightsModule:
    return cast(WeightsModule, modules.load(backend, "weights"))
