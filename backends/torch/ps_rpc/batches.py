"""A torch trainer's batch on the parameter servers: its ids split over the servers (by id modulo
the servers), the rows they return put back in batch order, and a trainer's share as a stream
for torch's DataLoader."""

from __future__ import annotations

from typing import List

import numpy as np
import torch

from unitrain.data.criteo import SPARSE_SLOTS
from unitrain.data.criteo_files import Share
from unitrain.errors import UnitrainError


def split(ids: np.ndarray, servers: int):
    """For each server, the positions of the batch's ids it holds (ids are spread by id modulo
    the servers) and, of those, the unique ids, each occurrence's index among them and each
    unique id's count."""
    flat = torch.from_numpy(ids.reshape(-1))
    parts = []
    for j in range(servers):
        positions = torch.nonzero(flat % servers == j).squeeze(1) if servers > 1 else torch.arange(len(flat))
        unique, inverse, counts = torch.unique(flat[positions], return_inverse=True, return_counts=True)
        parts.append((positions, unique, inverse, counts))
    return parts


def assemble(parts, rows: List[torch.Tensor], batch: int, dim: int):
    """Rows (each part's occurrences, in its positions' order) back in batch order: the deep
    embeddings [B, 26*dim] and the wide part's sum over the slots [B]."""
    positions = torch.cat([p[0] for p in parts])
    ordered = torch.cat(rows)[torch.argsort(positions)].reshape(batch, SPARSE_SLOTS, dim + 1)
    return ordered[..., :dim].reshape(batch, -1), ordered[..., dim].sum(dim=1)


class Stream(torch.utils.data.IterableDataset):
    """A trainer's share for torch's DataLoader: each loader worker parses every n-th batch,
    and the loader takes them from the workers in turn, so the order is the share's."""

    def __init__(self, share: Share, batch_size: int, skip: int):
        super().__init__()
        self.share, self.batch_size, self.skip = share, batch_size, skip

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        try:
            for batch in self.share.batches(self.batch_size, worker, workers, self.skip):
                yield batch.dense, batch.sparse, batch.label
        except UnitrainError as err:
            # The loader would wrap it in a worker traceback; the trainer re-raises it as one line.
            yield str(err)
