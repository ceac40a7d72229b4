"""The Backend: a framework's primitives the training loop needs, as one object.

``backends/<name>/backend.py`` subclasses it and provides ``create_backend()``;
:func:`get_backend` imports it on first use, so choosing ``torch`` never imports paddle and a
missing framework only matters to the backend that needs it. Everything else a backend offers
(its data loader, optimizer, distributed context, precision, profiler, models, export...) is a
module of its own, with a Protocol in the same-named module of :mod:`unitrain.interface`, loaded
by name: that is how the core reaches it. The few methods below that hand on to those modules
(``distributed``, ``precision``, ``build_optimizer``, ``set_lr``, ``make_loader``, ``tracer``)
are written once, here, for a loop of one's own (docs/library.md); models are built by
:func:`unitrain.model.build.build_model`.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Protocol, Tuple, cast

import numpy as np

from unitrain.config.schema import AmpConfig, DistConfig, OptimConfig, ProfilerConfig
from unitrain.errors import UnitrainError
from unitrain.host import processes
from unitrain.interface import modules
from unitrain.interface.data import data_module
from unitrain.interface.distributed import DistributedContext, distributed_module
from unitrain.interface.optim import optim_module
from unitrain.interface.precision import MixedPrecision, precision_module
from unitrain.interface.profiler import Tracer, profiler_module

#: A framework's own object (a module, an optimizer, a tensor): the core never looks inside.
Native = Any


class Backend(ABC):
    #: Registry name (``backend=<name>``).
    name: str
    #: The package that provides the framework, as pip names it.
    package: str

    # --- process-wide settings -------------------------------------------------------------
    @abstractmethod
    def version(self) -> str: ...

    @abstractmethod
    def set_threads(self, threads: int) -> None:
        """Intra-op CPU threads; set identically on both backends for a fair comparison."""

    @abstractmethod
    def threads(self) -> int: ...

    @abstractmethod
    def seed(self, seed: int) -> None:
        """Seed the framework's RNGs (initial weights, dropout)."""

    # --- a loop of one's own: each hands on to the backend's module of that name -------------
    def distributed(self, cfg: DistConfig | None = None, device: str = "auto") -> DistributedContext:
        return distributed_module(self.name).make_context(cfg, device)

    def precision(self, cfg: AmpConfig | None = None) -> MixedPrecision:
        return precision_module(self.name).make_precision(cfg or AmpConfig())

    def build_optimizer(self, model: Native, cfg: OptimConfig | None = None) -> Native:
        """Momentum SGD with L2 weight decay (or ``cfg.name``'s optimizer)."""
        return optim_module(self.name).build_optimizer(model, cfg or OptimConfig())

    def set_lr(self, optimizer: Native, lr: float) -> None:
        optim_module(self.name).set_lr(optimizer, lr)

    def make_loader(
        self, dataset: Any, batch_sampler: Iterable[List[int]], num_workers: int = 0, device: str = "cpu"
    ) -> Iterable[Tuple[Native, Native]]:
        """The framework's own DataLoader over a NumPy dataset, yielding (images, labels) on ``device``."""
        return data_module(self.name).make_loader(dataset, batch_sampler, num_workers, device)

    def tracer(self, cfg: ProfilerConfig, path: Path) -> Tracer:
        """The framework's profiler over the configured step window, writing a Chrome trace to ``path``."""
        return profiler_module(self.name).make_tracer(cfg, path)

    # --- step pieces ------------------------------------------------------------------------
    @abstractmethod
    def loss(self, logits: Native, labels: Native, label_smoothing: float = 0.0) -> Native:
        """Mean cross-entropy, computed in fp32, optionally against smoothed labels."""

    @abstractmethod
    def to_numpy(self, tensor: Native) -> np.ndarray: ...

    @abstractmethod
    def num_parameters(self, model: Native) -> int:
        """Trainable parameters (BatchNorm running statistics are not counted)."""

    @abstractmethod
    def state_arrays(self, model: Native) -> Dict[str, np.ndarray]:
        """Every parameter and buffer as NumPy, in the framework's own names and layouts."""

    @abstractmethod
    def load_state_arrays(self, model: Native, arrays: Dict[str, np.ndarray]) -> None:
        """Set the model's state from :meth:`state_arrays`-style NumPy arrays (names and shapes must match)."""

    @abstractmethod
    def save_training_state(self, path: Path, optimizer: Native, extra: Dict[str, Any]) -> None:
        """Optimizer state, RNG states and ``extra`` in the framework's own file format."""

    @abstractmethod
    def load_training_state(self, path: Path, optimizer: Native) -> Dict[str, Any]:
        """Restore what :meth:`save_training_state` wrote; returns its ``extra``."""

    @abstractmethod
    def parameter_arrays(self, model: Native) -> Dict[str, np.ndarray]:
        """Trainable parameters as NumPy arrays, by name (the names line up across backends)."""

    @abstractmethod
    def set_deterministic(self) -> Dict[str, Any]:
        """Ask the framework for deterministic kernels; returns what was set, for the record."""

    @contextlib.contextmanager
    def capture_outputs(self, model: Native) -> Iterator[List[Tuple[str, np.ndarray]]]:
        """Yield a list that fills with (layer name, NumPy output) for every leaf layer's call."""
        outputs: List[Tuple[str, np.ndarray]] = []

        def keep(name: str) -> Callable[[Native], None]:
            # Copied at once: to_numpy of a CPU float32 tensor shares its memory, which an
            # in-place activation after the layer (torch's nn.ReLU(inplace=True)) then rewrites.
            # A recurrent layer returns (output, state): its output is what the next layer reads.
            first = lambda out: out[0] if isinstance(out, (tuple, list)) else out  # noqa: E731
            return lambda out: outputs.append((name, np.array(self.to_numpy(first(out)), copy=True)))

        handles = [self._on_output(layer, keep(name)) for name, layer in self._leaf_layers(model)]
        try:
            yield outputs
        finally:
            for handle in handles:
                handle.remove()

    @abstractmethod
    def _leaf_layers(self, model: Native) -> Iterable[Tuple[str, Native]]:
        """(name, layer) for every layer without sub-layers."""

    @abstractmethod
    def _on_output(self, layer: Native, callback: Callable[[Native], None]) -> Any:
        """Call ``callback(output)`` after each forward of ``layer``; returns a handle with remove().
        A return other than None replaces the layer's output (model/user_code.pick_logits)."""

    @abstractmethod
    def peak_device_memory_mb(self, device: str) -> float | None:
        """Peak memory the framework allocated on an accelerator; None on the CPU."""

    @abstractmethod
    def freeze_batchnorm(self, model: Native) -> None:
        """Put BatchNorm layers in inference mode: running statistics used, not updated."""

    def describe(self) -> Dict[str, Any]:
        return {"backend": self.name, "framework": self.package, "version": self.version(), "threads": self.threads()}


def check_state(names: Iterable[str], shapes: Dict[str, tuple], arrays: Dict[str, Any]) -> None:
    """One line naming what does not fit, before a framework half-loads a state."""
    names = list(names)
    missing, unexpected = sorted(set(names) - set(arrays)), sorted(set(arrays) - set(names))
    if missing or unexpected:

        def some(keys: list) -> str:
            return ", ".join(keys[:3]) + ("..." if len(keys) > 3 else "")

        raise UnitrainError(
            f"the weights do not fit this model: {len(missing)} missing ({some(missing)}), {len(unexpected)} "
            f"unexpected ({some(unexpected)})"
        )
    wrong = [f"{k} {tuple(arrays[k].shape)} vs {shapes[k]}" for k in names if tuple(arrays[k].shape) != shapes[k]]
    if wrong:
        raise UnitrainError(
            f"the weights do not fit this model: shapes differ for {len(wrong)} tensor(s), e.g. {wrong[0]}"
        )


class BackendModule(Protocol):
    """What ``backends/<name>/backend.py`` provides."""

    def create_backend(self) -> Backend: ...


_INSTANCES: Dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    """The backend called ``name``, importing its framework on first use."""
    if name not in _INSTANCES:
        module = cast(BackendModule, modules.load(name, "backend"))
        _INSTANCES[name] = module.create_backend()
        processes.keep_out_of_collection()
    return _INSTANCES[name]
