"""Deployable models written by the framework's own exporters: what ``backends/<name>/export.py``
provides. The core (:mod:`unitrain.deploy.export`) checks every file before it keeps it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Mapping, Optional, Protocol, cast

import numpy as np

from unitrain.interface import modules

#: The formats an export can take.
FORMATS = ("native", "onnx")


class ExportModule(Protocol):
    #: Per format: what writes it, and the runtime the export check reads it back with.
    WRITERS: Mapping[str, str]
    CHECKED_WITH: Mapping[str, str]

    def save_native(self, model: Any, stem: Path, example: np.ndarray, batch: Optional[int]) -> List[Path]:
        """The framework's own deployable format beside ``stem``; ``batch`` None accepts any batch
        size. The input takes the example's shape (but the batch) and dtype: float32 images, int64
        token ids."""

    def save_onnx(self, model: Any, stem: Path, example: np.ndarray, batch: Optional[int]) -> List[Path]:
        """``<stem>.onnx``, whose input is ``images`` (the example's dtype) and output the logits."""


def export_module(backend: str) -> ExportModule:
    return cast(ExportModule, modules.load(backend, "export"))
