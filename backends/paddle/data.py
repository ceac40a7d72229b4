"""paddle.io.DataLoader over unitrain's NumPy datasets and batch sampler."""

from __future__ import annotations

from typing import Iterable, List

import paddle

__all__ = ["make_loader"]


def make_loader(
    dataset, batch_sampler: Iterable[List[int]], num_workers: int = 0, device: str = "cpu"
) -> paddle.io.DataLoader:
    # Paddle places the batches on the current device (set by the distributed context), so
    # unlike torch no extra move is needed.
    return paddle.io.DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=num_workers,
        return_list=True,
        persistent_workers=num_workers > 0,
    )
