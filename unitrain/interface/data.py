"""The framework's own data loader over unitrain's NumPy datasets and batch sampler: what
``backends/<name>/data.py`` provides. Samples and their order come from the core
(:mod:`unitrain.data`), so both frameworks see the same batches."""

from __future__ import annotations

from typing import Any, Iterable, List, Protocol, Tuple, cast

from unitrain.interface import modules


class DataModule(Protocol):
    def make_loader(
        self, dataset: Any, batch_sampler: Iterable[List[int]], num_workers: int = 0, device: str = "cpu"
    ) -> Iterable[Tuple[Any, Any]]:
        """Batches of (images, labels) as the framework's tensors, on ``device``."""


def data_module(backend: str) -> DataModule:
    return cast(DataModule, modules.load(backend, "data"))
