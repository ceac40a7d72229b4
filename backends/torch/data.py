"""torch.utils.data.DataLoader over unitrain's NumPy datasets and batch sampler."""

from __future__ import annotations

from typing import Iterable, Iterator, List, Tuple

import torch
from torch.utils.data import DataLoader

__all__ = ["make_loader"]


class DeviceLoader:
    """A DataLoader whose batches arrive on the training device."""

    def __init__(self, loader: DataLoader, device: str):
        self.loader, self.device = loader, torch.device(device)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for images, labels in self.loader:
            if self.device.type == "cpu":
                yield images, labels
            else:
                yield images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)


def make_loader(dataset, batch_sampler: Iterable[List[int]], num_workers: int = 0, device: str = "cpu") -> DeviceLoader:
    loader = DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=num_workers,
        pin_memory=not device.startswith("cpu"),
        persistent_workers=num_workers > 0,
    )
    return DeviceLoader(loader, device)
