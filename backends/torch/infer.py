"""Inference runtimes in torch for an ExportedProgram (.pt2): eager, and torch.compile of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import torch

from unitrain.infer import Runtime


class TorchEager(Runtime):
    name = "torch eager (torch.export.load)"

    def load(self) -> None:
        torch.set_num_threads(self.threads)
        self.module = torch.export.load(str(self.path)).module()

    def prepare(self, images: np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))

    def run(self, prepared) -> np.ndarray:
        with torch.inference_mode():
            return self.module(prepared).numpy()

    def observed(self) -> Dict[str, Any]:
        return {"threads": torch.get_num_threads(), "mkldnn": torch.backends.mkldnn.is_available()}


class TorchCompile(TorchEager):
    """``torch.compile`` (Inductor) of the loaded program; it compiles during warm-up, once per
    batch size. If Dynamo fell back to eager or split the graph, ``observed`` says so."""

    name = "torch.compile (inductor)"

    def load(self) -> None:
        super().load()
        import torch._dynamo

        torch._dynamo.reset()
        self.module = torch.compile(self.module)

    def observed(self) -> Dict[str, Any]:
        from torch._dynamo.utils import counters

        graphs = int(counters["stats"]["unique_graphs"])
        breaks = int(sum(counters["graph_break"].values()))
        return {**super().observed(), "compiled_graphs": graphs, "graph_breaks": breaks, "ran": "inductor" if graphs and not breaks else "eager fallback" if not graphs else "inductor with graph breaks"}


def runtimes(path: Path, threads: int) -> List[Runtime]:
    return [TorchEager(path, threads), TorchCompile(path, threads)]
