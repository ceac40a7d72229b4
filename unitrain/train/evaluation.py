"""Held-out evaluation: the model in inference mode over the whole held-out set, framework-neutral.

In data parallel each rank evaluates every K-th sample (no shuffling, no padding), and the sums
of loss and of correct predictions are all-reduced once: every held-out sample is counted
exactly once, so the result is the one a single process computes from the same weights. The
backends provide only inference mode (``backends/<name>/evaluation.py``); loss and accuracy
are computed here in NumPy, identically for both frameworks.
"""

from __future__ import annotations

import math
import time
from typing import Dict, Iterator, List

import numpy as np

from unitrain.data.datasets import guard
from unitrain.interface.backend import Backend
from unitrain.interface.data import data_module
from unitrain.interface.evaluation import evaluation_module
from unitrain.train.metrics import label_ranks


class HeldOutBatches:
    """This rank's share of ``num_samples`` held-out samples: indices ``rank, rank+K, ...`` in
    batches. Ranks may get one sample more or less than each other; none is repeated."""

    def __init__(self, num_samples: int, batch_size: int, num_replicas: int = 1, rank: int = 0):
        self.indices = np.arange(rank, num_samples, num_replicas, dtype=np.int64)
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[List[int]]:
        for start in range(0, len(self.indices), self.batch_size):
            yield self.indices[start : start + self.batch_size].tolist()

    def __len__(self) -> int:
        return math.ceil(len(self.indices) / self.batch_size)


def cross_entropy_sum(logits: np.ndarray, labels: np.ndarray) -> float:
    """Summed per-sample cross-entropy, in float64 (a stable log-sum-exp)."""
    logits = logits.astype(np.float64)
    top = logits.max(axis=1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    return float((log_norm - logits[np.arange(len(labels)), labels]).sum())


def correct_in_topk(logits: np.ndarray, labels: np.ndarray, k: int) -> int:
    """Samples whose label is among the k highest logits (ties as metrics.topk_accuracy counts them)."""
    return int((label_ranks(logits, labels) < min(k, logits.shape[1])).sum())


class Evaluator:
    """Evaluates a model on one held-out set; build it once (its loader starts workers once)."""

    def __init__(self, backend: Backend, dataset, dist, batch_size: int, num_workers: int = 0):
        self.backend, self.dataset, self.dist = backend, dataset, dist
        self.batches = HeldOutBatches(len(dataset), batch_size, dist.world_size, dist.rank)
        loader = data_module(backend.name).make_loader(dataset, self.batches, num_workers, dist.device)
        self.loader = guard(loader, dataset, backend)
        self.inference = evaluation_module(backend.name).inference

    def __call__(self, model, precision) -> Dict[str, float]:
        """``val_loss``, ``val_top1``, ``val_top5`` over the whole set, and ``eval_s``.

        ``model`` must be the unwrapped model: a DDP wrapper may synchronise buffers on every
        forward, a collective that ranks with different batch counts would wait on forever."""
        started = time.perf_counter()
        if self.dist.is_distributed:
            self._use_rank0_statistics(model)
        sums = np.zeros(4)  # loss, top-1 correct, top-5 correct, samples
        with self.inference(model):
            for images, labels in self.loader:
                with precision.autocast():
                    logits = model(precision.convert_input(images))
                # A language model's [batch, time, vocab]: every position is one prediction.
                logits = self.backend.to_numpy(logits).astype(np.float64)
                logits = logits.reshape(-1, logits.shape[-1])
                labels = self.backend.to_numpy(labels).reshape(-1).astype(np.int64)
                sums += (
                    cross_entropy_sum(logits, labels),
                    correct_in_topk(logits, labels, 1),
                    correct_in_topk(logits, labels, 5),
                    len(labels),
                )
        loss, top1, top5, count = self.dist.all_reduce(sums, "sum")
        return {
            "val_loss": loss / count,
            "val_top1": top1 / count,
            "val_top5": top5 / count,
            "val_samples": int(round(count)),
            "eval_s": time.perf_counter() - started,
        }

    def _use_rank0_statistics(self, model) -> None:
        """Give every rank rank 0's BatchNorm running statistics before evaluating.

        Gradients are averaged, but each rank's running statistics follow its own batches
        (DDP re-broadcasts them at the next forward, paddle.DataParallel never does): ranks
        evaluating their shards with their own statistics would evaluate different models. Rank
        0's are the ones its checkpoints hold."""
        state = self.backend.state_arrays(model)
        parameters = self.backend.parameter_arrays(model)
        buffers = self.dist.broadcast({k: v for k, v in state.items() if k not in parameters}, src=0)
        self.backend.load_state_arrays(model, {**state, **buffers})
