"""Per-step metrics from NumPy values, written as JSON lines."""

from __future__ import annotations

import json
import logging
import math
import statistics
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from unitrain.errors import UnitrainError
from unitrain.host.atomic import replace_text

log = logging.getLogger("unitrain")


def label_ranks(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each sample's count of other classes scored at least as high as its label (0: the label is the
    top class). A tie counts against the label, so constant logits are never right; a NaN label
    score ranks last. Counting, not sorting: an argsort per step was a visible part of a small
    language model's step (every position of a batch is a sample)."""
    score = logits[np.arange(len(labels)), labels.astype(np.int64)]  # Paddle's loaders give labels as float
    ranks = (logits >= score[:, None]).sum(axis=1) - 1
    return np.where(np.isnan(score), logits.shape[1], ranks)


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, ks: Sequence[int] = (1, 5)) -> Tuple[float, ...]:
    """Fraction of samples whose label is among the k highest logits, for each k (capped at #classes).
    A language model's [batch, time, vocab] logits count every position as a sample."""
    logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    ranks = label_ranks(logits, labels)
    return tuple(float(np.mean(ranks < min(k, logits.shape[1]))) for k in ks)


#: Every step's record, one JSON line each, in the run directory.
METRICS = "metrics.jsonl"


class MetricsLog:
    """Keeps every step's record and appends it to ``metrics.jsonl`` when a path is given.

    ``history`` (a resumed run's steps up to its checkpoint) starts the file; it is written
    beside and renamed into place, so that the earlier records are never lost half-way."""

    def __init__(self, path: Path | None = None, sinks: Sequence = (), history: Sequence[Dict[str, Any]] = ()):
        # Held-out evaluations are lines of their own (val_loss, val_top1, ...), kept apart from
        # the training steps whose means final() takes.
        self.records: List[Dict[str, float]] = [r for r in history if "loss" in r]
        self.evals: List[Dict[str, float]] = [r for r in history if "loss" not in r]
        self.sinks = list(sinks)  # TensorBoard / VisualDL writers, when asked for
        self._file = None
        if path and history:
            replace_text(Path(path), "".join(json.dumps(r) + "\n" for r in history))
            self._file = open(path, "a", encoding="utf-8")
        elif path:
            self._file = open(path, "w", encoding="utf-8")

    def append(self, record: Dict[str, float]) -> None:
        self.records.append(record)
        self._write(record)

    def append_eval(self, record: Dict[str, float]) -> None:
        self.evals.append(record)
        self._write(record)

    def _write(self, record: Dict[str, float]) -> None:
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


def metrics_history(run_dir: Path, up_to_step: int) -> List[Dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl`` up to and including ``up_to_step`` (a line
    that does not parse, say one cut short by a crash, ends the history)."""
    path = Path(run_dir) / METRICS
    records: List[Dict[str, Any]] = []
    if not path.is_file():
        return records
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            break
        if isinstance(record, dict) and record.get("step", math.inf) <= up_to_step:
            records.append(record)
    return records


def label_history(history: Sequence[Dict[str, Any]], ran_on: str, framework: str) -> List[Dict[str, Any]]:
    """``history`` as a run on ``framework`` keeps it: each record another framework ran carries
    that framework's name under ``"framework"``, so that a resume across frameworks leaves no
    doubt whose step times and clock a record holds; a record without it ran on the run's own
    framework. ``ran_on``: the framework of the run that wrote the history, for its own records."""
    labelled = []
    for record in history:
        record = dict(record)
        who = record.pop("framework", ran_on)
        labelled.append(record if who == framework else {**record, "framework": who})
    return labelled


def own_records(records: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The records the run's own framework ran (``label_history`` marks the others)."""
    return [r for r in records if "framework" not in r]


def steps_by_framework(records: Sequence[Dict[str, Any]], framework: str) -> Dict[str, int]:
    """How many training steps of ``records`` each framework ran (``label_history``'s marks)."""
    counts: Dict[str, int] = {}
    for record in records:
        if "loss" in record:
            who = record.get("framework", framework)
            counts[who] = counts.get(who, 0) + 1
    return counts


class NonFiniteLossError(UnitrainError):
    """The loss became NaN or infinite: the parameters are no longer usable."""

    exit_code = 1


class NonFiniteWatch:
    """``trainer.on_nonfinite``: stop at the first non-finite loss, or warn once and go on.

    A step that AMP's loss scaler skipped (inf/nan gradients) is the scaler doing its job, not
    a failure, so its loss is not held against the run."""

    def __init__(self, policy: str, lr: float):
        self.policy, self.lr, self.warned = policy, lr, False

    def check(self, step: int, loss: float, stepped: bool) -> None:
        if math.isfinite(loss) or not stepped:
            return
        if self.policy == "stop":
            raise NonFiniteLossError(
                f"the loss is {loss} at step {step}, so the parameters are no longer usable; lower optim.lr (base "
                f"{self.lr:g}), "
                "or set trainer.on_nonfinite=warn to train on regardless"
            )
        if not self.warned:
            log.warning("the loss is %s at step %d; training on (trainer.on_nonfinite=warn)", loss, step)
            self.warned = True

    def broken_state(self, step: int, name: str, kept: str) -> None:
        """The weights or optimizer state after ``step`` hold nan or inf: no checkpoint of them is
        written (``kept``: what is kept instead, in words); the run stops, or (warn) goes on without it."""
        if self.policy == "stop":
            raise NonFiniteLossError(
                f"after step {step} {name} is not finite, so the parameters are no longer usable and no checkpoint of "
                f"them was written ({kept}); lower optim.lr (base {self.lr:g}), or set trainer.on_nonfinite=warn to "
                "train on regardless"
            )
        log.warning(
            "after step %d %s is not finite: no checkpoint written (%s; trainer.on_nonfinite=warn)", step, name, kept
        )
