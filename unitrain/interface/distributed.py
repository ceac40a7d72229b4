"""DistributedContext: where this process sits in a job and how it talks to the others.

The base class is the complete single-process context; a backend overrides what its
collective library does differently once ``world_size > 1``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Protocol, TypeVar, cast

import numpy as np

from unitrain.config.schema import DistConfig
from unitrain.interface import modules

T = TypeVar("T")


#: grad_sync's comm_hook when gradients travel as they are.
NO_COMM_HOOK = "none (float32 all-reduce)"


class DistributedContext:
    #: Reduction operations accepted by :meth:`all_reduce`.
    REDUCE_OPS = ("mean", "sum", "max", "min")

    def __init__(self, device: str = "cpu", rank: int = 0, world_size: int = 1, local_rank: int = 0):
        self.device, self.rank, self.world_size, self.local_rank = device, rank, world_size, local_rank
        self._active = False
        # Set when the ``with`` block ends by an exception: peers may be gone, so teardown
        # must not wait on them (a barrier or a collective destroy would hang).
        self.failed = False

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    # Life cycle: usable as ``with backend.distributed() as dist: ...``; the process group is
    # released in ``teardown`` even when training raises, so sweeps never inherit one.
    def setup(self) -> "DistributedContext":
        self._active = True
        return self

    def teardown(self) -> None:
        self._active = False

    def __enter__(self) -> "DistributedContext":
        return self.setup()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.failed = exc_type is not None
        self.teardown()

    # Collectives. Single-process: identities.
    def barrier(self) -> None:
        pass

    def all_reduce(self, value: T, op: str = "mean") -> T:
        """Reduce a number or NumPy array over all ranks (for metrics); every rank gets the result."""
        if op not in self.REDUCE_OPS:
            raise ValueError(f"unknown reduce op {op!r}; available: {', '.join(self.REDUCE_OPS)}")
        if not self.is_distributed:
            return value
        # float64 so that sums of per-rank metrics do not lose digits.
        result = self._all_reduce_array(np.asarray(value, dtype=np.float64), "sum" if op == "mean" else op)
        if op == "mean":
            result = result / self.world_size
        return float(result) if np.ndim(value) == 0 else result

    def broadcast(self, obj: T, src: int = 0) -> T:
        """Send a picklable Python object from rank ``src`` to every rank."""
        return self._broadcast_object(obj, src) if self.is_distributed else obj

    # The framework primitives behind all_reduce and broadcast (called only when distributed).
    def _all_reduce_array(self, array: np.ndarray, op: str) -> np.ndarray:
        raise NotImplementedError

    def _broadcast_object(self, obj: T, src: int) -> T:
        raise NotImplementedError

    # Wrapping for data parallelism. Single-process: unchanged.
    def wrap_model(self, model: T) -> T:
        return model

    def wrap_optimizer(self, optimizer: T) -> T:
        return optimizer

    @contextlib.contextmanager
    def no_sync(self, model: Any) -> Iterator[None]:
        """Skip gradient synchronisation inside (non-final micro-steps of gradient accumulation)."""
        yield

    def grad_sync(self) -> dict | None:
        """How gradients were all-reduced, as the framework reports it (buckets, compression);
        None where nothing was synchronised."""
        return None

    def describe(self) -> dict:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "device": self.device,
            "comm_backend": getattr(self, "comm_backend", None) if self.is_distributed else None,
            "grad_sync": self.grad_sync(),
        }


class DistributedModule(Protocol):
    """What ``backends/<name>/distributed.py`` provides."""

    def make_context(self, cfg: Optional[DistConfig], device: str) -> DistributedContext:
        """This process's context, from the variables the framework's launcher set."""


def distributed_module(backend: str) -> DistributedModule:
    return cast(DistributedModule, modules.load(backend, "distributed"))
