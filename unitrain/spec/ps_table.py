"""A sparse table as a parameter server holds it: a row is created the first time its id is
seen, and each pushed row gradient is applied by the table's rule, in NumPy.

The rules are those of Paddle's servers (``paddle/fluid/distributed/ps/table/sparse_sgd_rule.cc``),
written on the gradient of the batch's mean loss, so that both engines apply one rule (which
optimizers have one, and the state each keeps, is :mod:`unitrain.spec.optimizers`'s table):

* ``sgd``: ``w -= lr * g``.
* ``adagrad`` (Paddle's StdAdaGradSGDRule): a row's gradient is first scaled to the mean
  over its occurrences in the push times the ids pushed (Paddle divides by the row's "show"
  count what its trainer multiplied by the id tensor's rows), ``s``; then
  ``w -= lr * s * sqrt(g0 / (g0 + G))`` and ``G += s**2``, with ``g0`` = INITIAL_G2SUM.
* ``adam`` (Paddle's SparseAdamSGDRule): Adam with each row's own step count (a row's
  bias correction follows its own updates, not the job's steps).

Weights are kept within +-WEIGHT_BOUND, as Paddle's rules keep them. Row values start uniform
in +-EMBED_INIT, drawn from a hash of (seed, id), so a row does not depend on when it was first
seen or which server holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping

import numpy as np

from unitrain.spec import optimizers

INITIAL_G2SUM = 3.0
BETA1, BETA2, EPSILON = 0.9, 0.999, 1e-8
WEIGHT_BOUND = 10.0
_GROW = 1.5
_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def initial_rows(ids: np.ndarray, width: int, seed: int, scale: float) -> np.ndarray:
    """Rows of ``width`` values uniform in +-scale, a pure function of (seed, id)."""
    keys = ids.astype(np.uint64)[:, None] * np.uint64(width) + np.arange(width, dtype=np.uint64)
    bits = _splitmix(keys ^ _splitmix(np.full(1, seed, np.uint64))) >> np.uint64(40)
    return ((bits.astype(np.float64) / float(1 << 24) * 2 - 1) * scale).astype(np.float32)


@dataclass(kw_only=True)
class SparseTable:
    width: int
    rule: str  # one of spec.optimizers.PS
    lr: float
    seed: int
    init_scale: float
    index: Dict[int, int] = field(default_factory=dict)
    weights: np.ndarray = field(default=None)
    state: Dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.weights is None:
            self.weights = np.zeros((0, self.width), np.float32)
            self.state = {name: np.zeros((0, *shape), np.float32) for name, shape in self._state_shapes().items()}

    def _state_shapes(self) -> Dict[str, tuple]:
        optimizer = optimizers.BY_NAME[str(self.rule)]
        return {
            **{name: (self.width,) for name in optimizer.row_state},
            **{name: () for name in optimizer.row_scalars},
        }

    @property
    def rows(self) -> int:
        return len(self.index)

    @property
    def nbytes(self) -> int:
        """Bytes of the rows in use and their rule's state (the arrays keep spare capacity)."""
        per_row = self.weights.itemsize * self.width + sum(a[:1].nbytes for a in self.state.values())
        return per_row * self.rows

    def _grow(self, rows: int) -> None:
        capacity = max(rows, int(len(self.weights) * _GROW), 1024)

        def grown(a: np.ndarray) -> np.ndarray:
            out = np.zeros((capacity, *a.shape[1:]), a.dtype)
            out[: len(a)] = a
            return out

        self.weights = grown(self.weights)
        self.state = {name: grown(a) for name, a in self.state.items()}

    def locate(self, ids: np.ndarray) -> np.ndarray:
        """Row positions of ``ids`` (unique), creating the rows not seen before."""
        index, positions = self.index, np.empty(len(ids), np.int64)
        new = []
        for k, key in enumerate(ids.tolist()):
            row = index.get(key)
            if row is None:
                row = index[key] = len(index)
                new.append(k)
            positions[k] = row
        if new:
            if self.rows > len(self.weights):
                self._grow(self.rows)
            fresh = positions[new]
            self.weights[fresh] = initial_rows(ids[new], self.width, self.seed, self.init_scale)
            if self.rule == "adam":
                self.state["beta1_pow"][fresh], self.state["beta2_pow"][fresh] = BETA1, BETA2
        return positions

    def pull(self, ids: np.ndarray) -> np.ndarray:
        rows = self.locate(ids)  # first: it may grow the arrays
        return self.weights[rows]

    def peek(self, ids: np.ndarray) -> np.ndarray:
        """Rows for prediction: an id never trained on gets its initial row, and no row is created."""
        out = initial_rows(ids, self.width, self.seed, self.init_scale)
        known = [(k, row) for k, row in enumerate(map(self.index.get, ids.tolist())) if row is not None]
        if known:
            at, rows = map(list, zip(*known))
            out[at] = self.weights[rows]
        return out

    def push(self, ids: np.ndarray, grads: np.ndarray, counts: np.ndarray, pushed: int) -> None:
        """Apply the gradients of unique ``ids`` (each the sum over its ``counts`` occurrences
        among the ``pushed`` ids of the batch)."""
        rows = self.locate(ids)
        w = self.weights[rows]
        _UPDATES[str(self.rule)](self, rows, w, grads, counts, pushed)
        self.weights[rows] = np.clip(w, -WEIGHT_BOUND, WEIGHT_BOUND)

    # --- the rules: each updates the rows' values ``w`` in place, and its state -------------
    def _sgd(self, rows: np.ndarray, w: np.ndarray, grads: np.ndarray, counts: np.ndarray, pushed: int) -> None:
        w -= self.lr * grads

    def _adagrad(self, rows: np.ndarray, w: np.ndarray, grads: np.ndarray, counts: np.ndarray, pushed: int) -> None:
        g2sum = self.state["g2sum"][rows].astype(np.float64)
        scaled = grads.astype(np.float64) * (pushed / counts.astype(np.float64))[:, None]
        w -= (self.lr * scaled * np.sqrt(INITIAL_G2SUM / (INITIAL_G2SUM + g2sum))).astype(np.float32)
        self.state["g2sum"][rows] = g2sum + scaled * scaled

    def _adam(self, rows: np.ndarray, w: np.ndarray, grads: np.ndarray, counts: np.ndarray, pushed: int) -> None:
        state = self.state
        m = BETA1 * state["m"][rows] + (1 - BETA1) * grads
        v = BETA2 * state["v"][rows] + (1 - BETA2) * grads * grads
        beta1_pow, beta2_pow = state["beta1_pow"][rows], state["beta2_pow"][rows]
        lr = (self.lr * np.sqrt(1 - beta2_pow) / (1 - beta1_pow)).astype(np.float32)
        w -= lr[:, None] * (m / (np.sqrt(v) + EPSILON))
        state["m"][rows], state["v"][rows] = m, v
        state["beta1_pow"][rows], state["beta2_pow"][rows] = beta1_pow * BETA1, beta2_pow * BETA2

    # --- checkpoints ----------------------------------------------------------------------
    def arrays(self) -> Dict[str, np.ndarray]:
        """The table as arrays, rows in the order they were created."""
        ids = np.fromiter(self.index.keys(), np.int64, self.rows)
        return {
            "ids": ids,
            "weights": self.weights[: self.rows].copy(),
            **{f"state.{k}": a[: self.rows].copy() for k, a in self.state.items()},
        }

    def add(self, arrays: Dict[str, np.ndarray], keep: np.ndarray | None = None) -> None:
        """Rows saved by :meth:`arrays` (those ``keep`` selects), added to this table: a job
        resumed with another number of servers gives each server its ids from every file."""
        keep = np.ones(len(arrays["ids"]), bool) if keep is None else keep
        ids = arrays["ids"][keep]
        fresh = [key for key in ids.tolist() if key not in self.index]
        if len(fresh) != len(ids):
            raise ValueError("rows loaded twice")
        first = self.rows
        self._grow(first + len(ids))
        for row, key in enumerate(ids.tolist(), first):
            self.index[key] = row
        self.weights[first : first + len(ids)] = arrays["weights"][keep]
        for k in self.state:
            self.state[k][first : first + len(ids)] = arrays[f"state.{k}"][keep]


_UPDATES: Mapping[str, Callable[..., None]] = optimizers.implemented(
    optimizers.PS, {"sgd": SparseTable._sgd, "adagrad": SparseTable._adagrad, "adam": SparseTable._adam}
)
