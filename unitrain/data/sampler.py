"""A framework-neutral distributed batch sampler.

The index stream of a rank depends only on (num_samples, batch_size, num_replicas, rank,
shuffle, seed, epoch, remainder, order), and is produced with NumPy, so Paddle's and
PyTorch's data loaders fed by it see the same samples in the same order.

The stream, for epoch ``e`` and ``K`` replicas over ``n`` samples:

1. ``per_replica`` is ``ceil(n / K)`` (``remainder="pad"``: the last round is completed
   with indices from the start of the order) or ``floor(n / K)`` (``remainder="drop"``:
   the remainder is dropped). Every rank gets exactly ``per_replica`` indices.
2. ``order="global"``: shuffle all indices with ``default_rng((seed, e))``, pad or drop, then
   rank ``r`` takes every K-th index starting at ``r`` (as paddle.io.DistributedBatchSampler
   and torch's DistributedSampler do).
   ``order="shard"``: pad or drop ``0..n-1``, rank ``r`` takes the ``r``-th contiguous shard,
   then shuffles it with ``default_rng((seed, e, r))``.
3. The rank's indices are cut into batches of ``batch_size``; ``drop_last`` drops a final
   short batch.
"""

from __future__ import annotations

import math
from typing import Iterator, List

import numpy as np


class DistributedBatchSampler:
    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        remainder: str = "pad",
        order: str = "global",
    ):
        if num_samples < 0 or batch_size <= 0 or num_replicas <= 0:
            raise ValueError("num_samples >= 0, batch_size > 0 and num_replicas > 0 are required")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} out of range for {num_replicas} replicas")
        if remainder not in ("pad", "drop"):
            raise ValueError(f"remainder must be 'pad' or 'drop', not {remainder!r}")
        if order not in ("global", "shard"):
            raise ValueError(f"order must be 'global' or 'shard', not {order!r}")
        self.num_samples, self.batch_size = num_samples, batch_size
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.remainder, self.order = remainder, order
        self.epoch, self.start_batch = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch's order; ``start_batch`` skips batches already trained (on resume)."""
        self.epoch, self.start_batch = epoch, start_batch

    @property
    def per_replica(self) -> int:
        split = math.ceil if self.remainder == "pad" else math.floor
        return split(self.num_samples / self.num_replicas) if self.num_samples else 0

    def _fit(self, order: np.ndarray, total: int) -> np.ndarray:
        # np.resize repeats from the start, which is exactly padding (even when total > 2n).
        return np.resize(order, total) if total > len(order) else order[:total]

    def indices(self) -> np.ndarray:
        """This rank's sample indices for the current epoch, in order."""
        per, total = self.per_replica, self.per_replica * self.num_replicas
        if total == 0:
            return np.empty(0, dtype=np.int64)
        if self.order == "global":
            order = np.arange(self.num_samples, dtype=np.int64)
            if self.shuffle:
                order = np.random.default_rng((self.seed, self.epoch)).permutation(order)
            return self._fit(order, total)[self.rank :: self.num_replicas]
        shard = self._fit(np.arange(self.num_samples, dtype=np.int64), total)[self.rank * per : (self.rank + 1) * per]
        if self.shuffle:
            shard = np.random.default_rng((self.seed, self.epoch, self.rank)).permutation(shard)
        return shard

    def __iter__(self) -> Iterator[List[int]]:
        indices = self.indices().tolist()
        for b in range(self.start_batch, self.batches_per_epoch):
            yield indices[b * self.batch_size : (b + 1) * self.batch_size]

    @property
    def batches_per_epoch(self) -> int:
        split = math.floor if self.drop_last else math.ceil
        return split(self.per_replica / self.batch_size)

    def __len__(self) -> int:
        """Batches this epoch still yields."""
        return max(0, self.batches_per_epoch - self.start_batch)
