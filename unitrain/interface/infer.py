"""Inference runtimes: what ``backends/<name>/infer.py`` provides for the native artifacts it
reads. ONNX Runtime, the framework-neutral one, is the core's (:mod:`unitrain.deploy.runtimes`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, cast

import numpy as np

from unitrain.interface import modules


class Runtime:
    """One way to run an artifact. ``load`` and ``prepare`` are outside the clock; ``run`` is
    what is timed: one inference on a prepared input, its logits read back as NumPy."""

    name = "runtime"
    #: The runtime of the fp32 model this one is set against (None: its own name).
    baseline: Optional[str] = None
    #: The input's dtype as the artifact declares it, read by ``load`` (float32 images, int64
    #: token ids ...): ``prepare`` casts to it.
    input_dtype: np.dtype = np.dtype(np.float32)

    def __init__(self, path: Path, threads: int):
        self.path, self.threads = path, threads

    def load(self) -> None: ...

    def prepare(self, images: np.ndarray) -> Any:
        return np.ascontiguousarray(images, dtype=self.input_dtype)

    def run(self, prepared: Any) -> np.ndarray:
        raise NotImplementedError

    def observed(self) -> Dict[str, Any]:
        """What really ran, as the runtime itself reports it after loading (never the request)."""
        return {}


class InferModule(Protocol):
    def runtimes(self, path: Path, threads: int) -> List[Runtime]:
        """Every runtime of the framework that reads the native artifact at ``path``."""


def infer_module(backend: str) -> InferModule:
    return cast(InferModule, modules.load(backend, "infer"))
