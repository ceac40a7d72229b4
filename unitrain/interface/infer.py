"""Inference runtimes: what a backend's ``infer.py`` provides for the artifacts it can read."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np


class Runtime:
    """One way to run an artifact. ``load`` and ``prepare`` are outside the clock; ``run`` is
    what is timed: one inference on a prepared input, its logits read back as NumPy."""

    name = "runtime"
    #: The runtime of the fp32 model this one is set against (None: its own name).
    baseline: Optional[str] = None

    def __init__(self, path: Path, threads: int):
        self.path, self.threads = path, threads

    def load(self) -> None: ...

    def prepare(self, images: np.ndarray) -> Any:
        return np.ascontiguousarray(images, dtype=np.float32)

    def run(self, prepared: Any) -> np.ndarray:
        raise NotImplementedError

    def observed(self) -> Dict[str, Any]:
        """What really ran, as the runtime itself reports it after loading (never the request)."""
        return {}

