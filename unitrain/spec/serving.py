"""The trained wide&deep model as it is served: a vocabulary of the ids the tables hold, their
rows, the dense tower, and the dense features' standardization, in NumPy.

A served model takes the standardized dense features [B, 13] and, per slot, the row of the id
in the vocabulary [B, 26] (an id the tables never held maps to the last row, all zeros: it adds
nothing, as a feature no training example carried). Both frameworks' exports compute
:meth:`Serving.predict`, which checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

import numpy as np

from unitrain.data.criteo import SPARSE_SLOTS, CtrData

FILE = "vocabulary.npz"


@dataclass(frozen=True, kw_only=True)
class Serving:
    ids: np.ndarray  # int64 [n], sorted
    rows: np.ndarray  # float32 [n + 1, dim + 1]: deep | wide; the last row zeros
    layers: Tuple[Tuple[np.ndarray, np.ndarray], ...]  # the deep tower, [in, out] weights, then the wide part's
    mean: np.ndarray
    std: np.ndarray
    buckets: int

    @classmethod
    def of(
        cls,
        *,
        ids: np.ndarray,
        rows: np.ndarray,
        layers: List[Tuple[np.ndarray, np.ndarray]],
        mean: np.ndarray,
        std: np.ndarray,
        buckets: int,
    ) -> "Serving":
        order = np.argsort(ids, kind="stable")
        table = np.concatenate([rows[order], np.zeros((1, rows.shape[1]), np.float32)]).astype(np.float32)
        return cls(
            ids=ids[order].astype(np.int64),
            rows=table,
            layers=tuple((w.astype(np.float32), b.astype(np.float32)) for w, b in layers),
            mean=mean.astype(np.float32),
            std=std.astype(np.float32),
            buckets=buckets,
        )

    @property
    def dim(self) -> int:
        return self.rows.shape[1] - 1

    def locate(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row; ids not in the vocabulary get the last (zero) row."""
        at = np.minimum(np.searchsorted(self.ids, ids), max(len(self.ids) - 1, 0))
        found = self.ids[at] == ids if len(self.ids) else np.zeros(ids.shape, bool)
        return np.where(found, at, len(self.ids)).astype(np.int64)

    def inputs(self, rows: CtrData) -> Tuple[np.ndarray, np.ndarray]:
        """What a served model takes for raw parsed rows: standardized dense features and rows."""
        dense = ((rows.dense - self.mean) / self.std).astype(np.float32)
        return dense, self.locate(rows.sparse)

    def predict(self, dense: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Click probabilities, in float32 NumPy: the reference every export is checked against."""
        looked = self.rows[rows]  # [B, 26, dim + 1]
        x = np.concatenate([dense, looked[..., : self.dim].reshape(len(dense), SPARSE_SLOTS * self.dim)], axis=1)
        *deep, (wide_w, wide_b) = self.layers
        for i, (w, b) in enumerate(deep):
            x = x @ w + b
            if i < len(deep) - 1:
                x = np.maximum(x, 0)
        logit = x[:, 0] + (dense @ wide_w + wide_b)[:, 0] + looked[..., self.dim].sum(axis=1)
        return (1 / (1 + np.exp(-logit.astype(np.float64)))).astype(np.float32)

    def save(self, folder: Path) -> Path:
        path = folder / FILE
        flat = {f"layer{i}.{k}": a for i, (w, b) in enumerate(self.layers) for k, a in (("w", w), ("b", b))}
        np.savez(path, ids=self.ids, rows=self.rows, mean=self.mean, std=self.std, buckets=self.buckets, **flat)
        return path

    @classmethod
    def load(cls, folder: Path) -> "Serving":
        with np.load(folder / FILE) as f:
            count = sum(1 for k in f.files if k.endswith(".w"))
            return cls(
                ids=f["ids"],
                rows=f["rows"],
                layers=tuple((f[f"layer{i}.w"], f[f"layer{i}.b"]) for i in range(count)),
                mean=f["mean"],
                std=f["std"],
                buckets=int(f["buckets"]),
            )
