"""Serving a parameter-server job's wide&deep model: what ``backends/<name>/serving.py``
provides. The core (:mod:`unitrain.spec.serving`, :mod:`unitrain.deploy.ps_export`) holds the
model as NumPy arrays and checks every exported file against them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Protocol, Tuple, cast

import numpy as np

from unitrain.interface import modules
from unitrain.spec.serving import Serving

#: (ids, rows [n, dim + 1] deep | wide, the tower's layers as [in, out] weights and biases)
Parts = Tuple[np.ndarray, np.ndarray, List[Tuple[np.ndarray, np.ndarray]]]
Predict = Callable[[np.ndarray, np.ndarray], np.ndarray]


class ServingModule(Protocol):
    #: Per format: what writes it, and the runtime that reads it back.
    WRITERS: Mapping[str, str]
    READERS: Mapping[str, str]

    def read_checkpoint(self, folder: Path, config: Dict[str, Any]) -> Parts:
        """The tables and the dense tower of a checkpoint this framework's job wrote."""

    def save(self, serving: Serving, stem: Path, fmt: str) -> List[Path]:
        """The served model beside ``stem``: ``native`` (the framework's deployable format) or
        ``onnx``; inputs ``dense`` [B, 13] float32 and ``rows`` [B, 26] int64, output the
        click probability [B]."""

    def load_native(self, files: List[Path], threads: int) -> Predict:
        """A native export loaded by the framework's deployment runtime alone."""


def serving_module(backend: str) -> ServingModule:
    return cast(ServingModule, modules.load(backend, "serving"))
