"""Criteo TSV rows as both hand-written scripts read them (a user's own reader, written once
for the two): counts as log(1 + max(x, 0)) standardized by the first rows, ids as CRC-32 of
(slot, value) modulo the buckets, whole batches in file order."""

from __future__ import annotations

import math
import zlib
from typing import Iterator, List, Tuple

import numpy as np

DENSE, SLOTS = 13, 26
STATS_ROWS = 10_000  # rows whose dense features set the shift and scale every trainer applies

Batch = Tuple[np.ndarray, np.ndarray, np.ndarray]  # dense [B, 13], ids [B, 26], label [B]


def parse(line: str, buckets: int) -> Tuple[float, List[float], List[int]]:
    """One TSV row: counts as log(1 + max(x, 0)), ids as CRC-32 of (slot, value) mod buckets."""
    f = line.rstrip("\n").split("\t")
    dense = [math.log1p(max(int(x), 0)) if x else 0.0 for x in f[1 : 1 + DENSE]]
    ids = [zlib.crc32(f"C{s + 1}\x1f{v}".encode()) % buckets for s, v in enumerate(f[1 + DENSE :])]
    return float(f[0]), dense, ids


def lines(files: List[str]) -> Iterator[str]:
    for path in files:
        with open(path, encoding="utf-8") as f:
            yield from f


def dense_stats(files: List[str], buckets: int) -> Tuple[np.ndarray, np.ndarray]:
    """Mean and std of the dense features over the data's first STATS_ROWS rows."""
    head = [parse(line, buckets)[1] for _, line in zip(range(STATS_ROWS), lines(files))]
    dense = np.asarray(head, np.float32)
    return dense.mean(axis=0), dense.std(axis=0) + 1e-6


def batches(files: List[str], size: int, buckets: int, mean: np.ndarray, std: np.ndarray) -> Iterator[Batch]:
    """Whole batches of the files, parsed as they are read (the last partial one is dropped)."""
    rows: List[Tuple[float, List[float], List[int]]] = []
    for line in lines(files):
        rows.append(parse(line, buckets))
        if len(rows) == size:
            label, dense, ids = zip(*rows)
            dense_ = (np.asarray(dense, np.float32) - mean) / std
            yield dense_.astype(np.float32), np.asarray(ids, np.int64), np.asarray(label, np.float32)
            rows = []
