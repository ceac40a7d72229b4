"""Per-step metrics from NumPy values, written as JSON lines."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, ks: Sequence[int] = (1, 5)) -> Tuple[float, ...]:
    """Fraction of samples whose label is among the k highest logits, for each k (capped at #classes)."""
    labels = labels.reshape(-1)
    order = np.argsort(-logits, axis=1)
    return tuple(float(np.mean(np.any(order[:, : min(k, logits.shape[1])] == labels[:, None], axis=1))) for k in ks)


class MetricsLog:
    """Keeps every step's record and appends it to ``metrics.jsonl`` when a path is given."""

    def __init__(self, path: Path | None = None, sinks: Sequence = ()):
        self.records: List[Dict[str, float]] = []
        self.sinks = list(sinks)  # TensorBoard / VisualDL writers, when asked for
        self._file = open(path, "w", encoding="utf-8") if path else None

    def append(self, record: Dict[str, float]) -> None:
        self.records.append(record)
        if self._file:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        for sink in self.sinks:
            sink.log(int(record["step"]), record)

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None
        for sink in self.sinks:
            sink.close()
        self.sinks = []

    def final(self, window: int = 10) -> Dict[str, float]:
        """Means over the last ``window`` steps: one step's loss is too noisy to compare runs by."""
        tail = self.records[-window:]
        if not tail:
            return {}
        out = {key: statistics.fmean(r[key] for r in tail) for key in ("loss", "top1", "top5")}
        out["window"] = len(tail)
        out["finite"] = all(math.isfinite(r["loss"]) for r in self.records)
        return out
