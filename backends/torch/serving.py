"""The served wide&deep model in torch: read from a torch parameter-server checkpoint, written
as an ExportedProgram (.pt2) and as ONNX, read back with ``torch.export.load``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

from unitrain.backends.torch.export import onnx_export
from unitrain.data.criteo import DENSE_FEATURES, SPARSE_SLOTS
from unitrain.spec.serving import Serving

__all__ = ["READERS", "WRITERS", "load_native", "read_checkpoint", "save"]

WRITERS = {"native": "torch.export", "onnx": "torch.onnx.export"}
READERS = {"native": "torch.export.load", "onnx": "onnxruntime"}


def read_checkpoint(folder: Path, config: Dict[str, Any]) -> Tuple[np.ndarray, np.ndarray, List]:
    ids, rows = [], []
    for path in sorted(folder.glob("table.*.npz")):
        with np.load(path) as saved:
            ids.append(saved["ids"])
            rows.append(saved["weights"])
    tower = torch.load(folder / "dense.pt", weights_only=True)["tower"]
    deep = sorted({int(k.split(".")[1]) for k in tower if k.startswith("deep.")})
    layers = [(tower[f"deep.{i}.weight"].numpy().T, tower[f"deep.{i}.bias"].numpy()) for i in deep]
    layers.append((tower["wide_dense.weight"].numpy().T, tower["wide_dense.bias"].numpy()))
    return np.concatenate(ids), np.concatenate(rows), layers


class Served(torch.nn.Module):
    def __init__(self, serving: Serving):
        super().__init__()
        self.dim = serving.dim
        self.register_buffer("table", torch.from_numpy(serving.rows.copy()))
        *deep, (wide_w, wide_b) = serving.layers
        self.deep = torch.nn.ModuleList(_linear(w, b) for w, b in deep)
        self.wide = _linear(wide_w, wide_b)

    def forward(self, dense: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        looked = self.table[rows]  # [B, 26, dim + 1]
        x = torch.cat([dense, looked[..., : self.dim].reshape(-1, SPARSE_SLOTS * self.dim)], dim=1)
        for i, layer in enumerate(self.deep):
            x = layer(x)
            if i < len(self.deep) - 1:
                x = torch.relu(x)
        return torch.sigmoid(x[:, 0] + self.wide(dense)[:, 0] + looked[..., self.dim].sum(dim=1))


def _linear(weight: np.ndarray, bias: np.ndarray) -> torch.nn.Linear:
    layer = torch.nn.Linear(*weight.shape)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(weight.T)))
        layer.bias.copy_(torch.from_numpy(bias))
    return layer


def _example() -> Tuple[Tuple[torch.Tensor, torch.Tensor], Any]:
    batch = torch.export.Dim("batch", min=1, max=65536)
    example = (torch.zeros(2, DENSE_FEATURES), torch.zeros(2, SPARSE_SLOTS, dtype=torch.int64))
    return example, ({0: batch}, {0: batch})


def save(serving: Serving, stem: Path, fmt: str) -> List[Path]:
    model, (example, shapes) = Served(serving).eval(), _example()
    if fmt == "native":
        path = stem.with_name(stem.name + ".pt2")
        torch.export.save(torch.export.export(model, example, dynamic_shapes=shapes), path)
        return [path]
    path = stem.with_name(stem.name + ".onnx")
    onnx_export(model, example, path, ["dense", "rows"], ["probability"], shapes)
    return [path]


def load_native(files: List[Path], threads: int):
    torch.set_num_threads(threads)
    module = torch.export.load(str(files[0])).module()

    def predict(dense: np.ndarray, rows: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(dense), torch.from_numpy(rows)).numpy()

    return predict
