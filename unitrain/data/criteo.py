"""Click-through data in Criteo's format, for the wide&deep parameter-server job, in NumPy.

A Criteo row is one tab-separated line: ``label, I1..I13, C1..C26`` (13 integer counts, 26
categorical values written as hex strings; any field may be empty). Both frameworks train on
the arrays made here, so they see the same rows, ids and order:

* counts become ``log(1 + max(x, 0))`` (empty: 0), as in DLRM's Criteo preprocessing;
* a categorical value becomes an id in ``[0, buckets)`` by CRC-32 of ``slot, value`` (empty
  values hash too, to one id per slot). zlib's CRC-32 is stable across processes and machines,
  unlike Python's salted ``hash()``, which would give each trainer different ids.

``synthetic`` writes Criteo-format lines whose labels come from a hidden logistic "teacher",
so that a model can learn them (AUC well above 0.5); they go through the same parser.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Tuple

import numpy as np

from unitrain.errors import Refusal

DENSE_FEATURES = 13
SPARSE_SLOTS = 26
FIELDS = 1 + DENSE_FEATURES + SPARSE_SLOTS
#: RNG streams of the synthetic rows: training rows, the teacher, held-out rows.
TRAIN, TEACHER, HELD_OUT = 0, 1, 2
#: Synthetic rows are drawn in blocks, each from its own (seed, stream, block) generator, so a
#: row depends on its index only, not on how many rows were asked for.
BLOCK = 4096


@dataclass
class CtrData:
    dense: np.ndarray  # float32 [n, 13]
    sparse: np.ndarray  # int64 [n, 26], hashed ids
    label: np.ndarray  # float32 [n], 0 or 1

    def __len__(self) -> int:
        return len(self.label)

    def rows(self, index) -> "CtrData":
        return CtrData(self.dense[index], self.sparse[index], self.label[index])

    def shard(self, index: int, count: int) -> "CtrData":
        """Trainer ``index`` of ``count`` reads every count-th row from its own offset: the
        shards are disjoint and together hold every row once."""
        return self.rows(slice(index, None, count))

    def batches(self, batch_size: int) -> Iterator["CtrData"]:
        """Whole batches in order; a last partial batch is left out, so every trainer of a
        synchronous job takes the same number of steps."""
        for start in range(0, len(self) - batch_size + 1, batch_size):
            yield self.rows(slice(start, start + batch_size))

    @property
    def positive_rate(self) -> float:
        return float(self.label.mean()) if len(self) else float("nan")


def hash_value(slot: int, value: str, buckets: int) -> int:
    return zlib.crc32(f"C{slot + 1}\x1f{value}".encode()) % buckets


def parse_lines(lines: Iterable[str], buckets: int, source: str = "data.path") -> CtrData:
    """Criteo TSV lines as arrays, numbered from 1 in ``source`` (see :func:`parse_numbered`)."""
    return parse_numbered(((source, number, line) for number, line in enumerate(lines, 1)), buckets)


def parse_numbered(lines: Iterable[Tuple[str, int, str]], buckets: int) -> CtrData:
    """(source, line number, line) triples as arrays; a line with the wrong number of fields,
    or a label or count that is not an integer, is refused in one line naming its source and
    line number."""
    labels: List[float] = []
    dense: List[List[float]] = []
    sparse: List[List[int]] = []
    source = "data.path"

    def refuse(source: str, number: int, why: str) -> Refusal:
        return Refusal(
            f"{source} is not allowed: line {number} {why}; Criteo rows are {FIELDS} tab-separated fields (label 0/1, "
            "I1..I13 integers or empty, C1..C26)"
        )

    for source, number, line in lines:
        fields = line.rstrip("\n").split("\t")
        if len(fields) != FIELDS:
            raise refuse(source, number, f"has {len(fields)} fields")
        try:
            label = int(fields[0])
            counts = [math.log1p(max(int(f), 0)) if f else 0.0 for f in fields[1 : 1 + DENSE_FEATURES]]
        except ValueError:
            raise refuse(source, number, "has a label or count that is not an integer") from None
        if label not in (0, 1):
            raise refuse(source, number, f"has the label {fields[0]!r}")
        labels.append(float(label))
        dense.append(counts)
        sparse.append([hash_value(s, v, buckets) for s, v in enumerate(fields[1 + DENSE_FEATURES :])])
    if not labels:
        raise Refusal(f"{source} is not allowed: it holds no rows; Criteo rows are {FIELDS} tab-separated fields")
    return CtrData(
        np.asarray(dense, np.float32).reshape(-1, DENSE_FEATURES),
        np.asarray(sparse, np.int64).reshape(-1, SPARSE_SLOTS),
        np.asarray(labels, np.float32),
    )


#: The distinct values of each categorical slot of Criteo's Display Advertising Challenge
#: training set (as DLRM's preprocessing counts them): three slots above 5 million values, a
#: long tail of small ones.
CRITEO_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
#: data.cardinality -> the slots' sizes (None: drawn from the seed, 4 to 2,000 values each).
CARDINALITIES = {"small": None, "criteo": CRITEO_CARDINALITIES}


class Teacher:
    """The hidden logistic model behind the synthetic labels: a weight per count and per
    categorical value, with a bias that puts the click rate near 30%, as in Criteo's data.

    Counts are log-normal (log(1 + count) spreads about 1 around a per-feature centre), so the
    dense features carry a signal a model finds in a few hundred rows; the categorical values
    add more, learned as rows accumulate. ``cardinality``: "small" slots (4 to 2,000 values,
    the tables hardly grow), or Criteo's own sizes (millions of values in a few slots: tables
    grow with every row), whose values' weights are drawn from a hash of (seed, slot, value)
    rather than held in arrays of 35 million."""

    def __init__(self, seed: int, cardinality: str = "small"):
        rng = np.random.default_rng((seed, TEACHER))
        # Slots of very different sizes, as in Criteo (a few values to many thousands).
        drawn = rng.integers(4, 2000, SPARSE_SLOTS)
        sizes = CARDINALITIES[cardinality]
        self.vocab = drawn if sizes is None else np.asarray(sizes, np.int64)
        self.log_centre = rng.uniform(0.5, 4.0, DENSE_FEATURES)
        self.dense_w = rng.normal(0, 0.6, DENSE_FEATURES)
        # Some slots matter much more than others.
        self.scale = rng.uniform(0.05, 0.5, SPARSE_SLOTS)
        self.seed = seed
        self.value_w = [rng.normal(0, s, v) for s, v in zip(self.scale, drawn)] if sizes is None else None
        self.bias = -1.0

    def value_weights(self, slot: int, values: np.ndarray) -> np.ndarray:
        if self.value_w is not None:
            return self.value_w[slot][values]
        return self.scale[slot] * hashed_normal(self.seed, slot, values)

    def counts(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.maximum(np.floor(np.expm1(rng.normal(self.log_centre, 1.0, (n, DENSE_FEATURES)))), 0).astype(np.int64)

    def logits(self, log_counts: np.ndarray, values: np.ndarray) -> np.ndarray:
        return (
            self.bias
            + (log_counts - self.log_centre) @ self.dense_w
            + sum(self.value_weights(s, values[:, s]) for s in range(SPARSE_SLOTS))
        )


def hashed_normal(seed: int, slot: int, values: np.ndarray) -> np.ndarray:
    """A standard normal draw per (seed, slot, value), the same in every process: splitmix64 of
    the triple, two uniforms from its halves, Box-Muller."""
    with np.errstate(over="ignore"):
        x = np.asarray(values, np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        x += np.uint64((seed * 1_000_003 + slot + 1) & 0xFFFFFFFFFFFFFFFF)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    high = ((x >> np.uint64(32)).astype(np.float64) + 0.5) / 2.0**32
    low = ((x & np.uint64(0xFFFFFFFF)).astype(np.float64) + 0.5) / 2.0**32
    return np.sqrt(-2.0 * np.log(high)) * np.cos(2.0 * np.pi * low)


def synthetic_blocks(
    num_rows: int, seed: int, stream: int = TRAIN, cardinality: str = "small"
) -> Iterator[Tuple[List[str], np.ndarray]]:
    """Criteo-format lines in blocks of up to BLOCK, each with the teacher's click probability
    of its rows; row i depends on (seed, stream, cardinality, i) only."""
    teacher = Teacher(seed, cardinality)
    for block in range(math.ceil(num_rows / BLOCK)):
        # Always a whole block drawn (then cut), so the draws do not depend on num_rows.
        n, keep = BLOCK, min(BLOCK, num_rows - block * BLOCK)
        rng = np.random.default_rng((seed, stream, block))
        counts = teacher.counts(rng, n)
        missing_count = rng.random((n, DENSE_FEATURES)) < 0.1
        # Skewed value frequencies: low indices are common, as in click logs.
        values = np.floor(teacher.vocab * rng.random((n, SPARSE_SLOTS)) ** 3).astype(np.int64)
        missing_value = rng.random((n, SPARSE_SLOTS)) < 0.05
        log_counts = np.where(missing_count, 0.0, np.log1p(counts))
        logits = teacher.logits(log_counts, values) - 0.5 * missing_value.sum(axis=1) / SPARSE_SLOTS
        probabilities = 1.0 / (1.0 + np.exp(-logits))
        labels = rng.random(n) < probabilities
        lines = []
        for i in range(keep):
            dense = ["" if missing_count[i, j] else str(counts[i, j]) for j in range(DENSE_FEATURES)]
            # Values written as Criteo writes them: 8 hex digits, here a hash of slot and index.
            cats = [
                "" if missing_value[i, s] else f"{zlib.crc32(f'{seed}:{s}:{values[i, s]}'.encode()):08x}"
                for s in range(SPARSE_SLOTS)
            ]
            lines.append("\t".join([str(int(labels[i])), *dense, *cats]))
        yield lines, probabilities[:keep]


def synthetic_lines(num_rows: int, seed: int, stream: int = TRAIN, cardinality: str = "small") -> List[str]:
    """``num_rows`` Criteo-format lines; row i depends on (seed, stream, cardinality, i) only."""
    return [line for lines, _ in synthetic_blocks(num_rows, seed, stream, cardinality) for line in lines]


def synthetic(num_rows: int, seed: int, buckets: int, stream: int = TRAIN, cardinality: str = "small") -> CtrData:
    lines = synthetic_lines(num_rows, seed, stream, cardinality)
    return parse_lines(lines, buckets, source="data='criteo_synthetic'")


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a random positive scores above a random
    negative (ties count half), from the ranks of the scores. nan without both classes."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, np.float64).reshape(-1)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if not positives or not negatives:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), np.float64)
    ranks[order] = np.arange(1, len(scores) + 1)
    # Tied scores share the mean of their ranks.
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    ranks = (sums / counts)[inverse]
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def log_loss(labels: np.ndarray, probabilities: np.ndarray, eps: float = 1e-7) -> float:
    labels = np.asarray(labels, np.float64).reshape(-1)
    p = np.clip(np.asarray(probabilities, np.float64).reshape(-1), eps, 1 - eps)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))
