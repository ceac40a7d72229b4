"""The Backend interface and the registry that finds one by name.

A backend is the whole of what unitrain needs from a framework. Each lives in
``unitrain.backends.<name>`` with the same module names (models, data, optim, distributed,
precision, runtime) and is imported only when asked for, so choosing ``torch`` never imports
paddle and a missing framework only matters to the backend that needs it.
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Sequence, Tuple

import numpy as np

from unitrain.config.schema import AmpConfig, DistConfig, OptimConfig, ProfilerConfig
from unitrain.interface.distributed import DistributedContext
from unitrain.errors import BackendUnavailableError, UnitrainError, UnknownNameError
from unitrain.model.weights import from_canonical, to_canonical
from unitrain.model.initial_weights import shared_init
from unitrain.model.specs import MODELS, ResNetSpec
from unitrain.interface.precision import MixedPrecision
from unitrain.interface.profiler import Tracer


class Backend(ABC):
    #: Registry name (``backend=<name>``).
    name: str
    #: The top-level module of the framework and the package that provides it.
    framework: str
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

    # --- building blocks --------------------------------------------------------------------
    @abstractmethod
    def distributed(self, cfg: DistConfig | None = None, device: str = "auto") -> DistributedContext: ...

    def precision(self, cfg: AmpConfig | None = None) -> MixedPrecision:
        return MixedPrecision(cfg)

    def build_model(
        self, model: str | ResNetSpec, num_classes: int, device: str | None = None, zero_init_residual: bool = True, init: str = "framework", seed: int = 0
    ):
        """A ResNet from the shared specs (``"tiny"``, ``"resnet18"``, ``"resnet18_cifar"``, ``"resnet18_stride2"``, ``"resnet50"``), on ``device``.

        ``init="shared"`` loads weights drawn in NumPy from ``seed``: the same on every framework.
        """
        spec = MODELS.get(model) if isinstance(model, str) else model
        net = self._build_resnet(spec, num_classes, zero_init_residual)
        if init == "shared":
            canonical = to_canonical(self.name, self.state_arrays(net))
            shapes = {name: tuple(array.shape) for name, array in canonical.items()}
            self.load_state_arrays(net, from_canonical(self.name, shared_init(shapes, spec, seed, zero_init_residual)))
        # Both frameworks' layers have .to(device) returning the layer itself.
        return net.to(device) if device else net

    @abstractmethod
    def _build_resnet(self, spec: ResNetSpec, num_classes: int, zero_init_residual: bool): ...

    @abstractmethod
    def build_optimizer(self, model, cfg: OptimConfig | None = None):
        """Momentum SGD with L2 weight decay, the seed's optimizer."""

    @abstractmethod
    def set_lr(self, optimizer, lr: float) -> None: ...

    @abstractmethod
    def make_loader(self, dataset, batch_sampler: Iterable[List[int]], num_workers: int = 0, device: str = "cpu"):
        """The framework's own DataLoader over a NumPy dataset, yielding (images, labels) on ``device``."""

    # --- step pieces ------------------------------------------------------------------------
    @abstractmethod
    def loss(self, logits, labels, label_smoothing: float = 0.0):
        """Mean cross-entropy, computed in fp32, optionally against smoothed labels."""

    @abstractmethod
    def to_numpy(self, tensor): ...

    @abstractmethod
    def num_parameters(self, model) -> int:
        """Trainable parameters (BatchNorm running statistics are not counted)."""

    @abstractmethod
    def state_arrays(self, model) -> Dict[str, Any]:
        """Every parameter and buffer as NumPy, in the framework's own names and layouts."""

    @abstractmethod
    def load_state_arrays(self, model, arrays: Dict[str, Any]) -> None:
        """Set the model's state from :meth:`state_arrays`-style NumPy arrays (names and shapes must match)."""

    @abstractmethod
    def save_training_state(self, path: Path, optimizer, extra: Dict[str, Any]) -> None:
        """Optimizer state, RNG states and ``extra`` in the framework's own file format."""

    @abstractmethod
    def load_training_state(self, path: Path, optimizer) -> Dict[str, Any]:
        """Restore what :meth:`save_training_state` wrote; returns its ``extra``."""

    @abstractmethod
    def parameter_arrays(self, model) -> Dict[str, Any]:
        """Trainable parameters as NumPy arrays, by name (the names line up across backends)."""

    @abstractmethod
    def set_deterministic(self) -> Dict[str, Any]:
        """Ask the framework for deterministic kernels; returns what was set, for the record."""

    @contextlib.contextmanager
    def capture_outputs(self, model) -> Iterator[List[Tuple[str, Any]]]:
        """Yield a list that fills with (layer name, NumPy output) for every leaf layer's call."""
        outputs: List[Tuple[str, Any]] = []
        # Copied at once: to_numpy of a CPU float32 tensor shares its memory, which an in-place
        # activation after the layer (torch's ResNets use nn.ReLU(inplace=True)) then rewrites.
        handles = [
            self._on_output(layer, lambda out, name=name: outputs.append((name, np.array(self.to_numpy(out), copy=True))))
            for name, layer in self._leaf_layers(model)
        ]
        try:
            yield outputs
        finally:
            for handle in handles:
                handle.remove()

    @abstractmethod
    def _leaf_layers(self, model) -> Iterable[Tuple[str, Any]]:
        """(name, layer) for every layer without sub-layers."""

    @abstractmethod
    def _on_output(self, layer, callback):
        """Call ``callback(output)`` after each forward of ``layer``; returns a handle with remove()."""

    @abstractmethod
    def tracer(self, cfg: ProfilerConfig, path: Path) -> Tracer:
        """The framework's profiler over the configured step window, writing a Chrome trace to ``path``."""

    @abstractmethod
    def peak_device_memory_mb(self, device: str) -> float | None:
        """Peak memory the framework allocated on an accelerator; None on the CPU."""

    @abstractmethod
    def freeze_batchnorm(self, model) -> None:
        """Put BatchNorm layers in inference mode: running statistics used, not updated."""

    def describe(self) -> Dict[str, Any]:
        return {"backend": self.name, "framework": self.package, "version": self.version(), "threads": self.threads()}


def check_state(names, shapes: Dict[str, tuple], arrays: Dict[str, Any]) -> None:
    """One line naming what does not fit, before a framework half-loads a state."""
    missing, unexpected = sorted(set(names) - set(arrays)), sorted(set(arrays) - set(names))
    if missing or unexpected:
        raise UnitrainError(
            f"the weights do not fit this model: {len(missing)} missing ({', '.join(missing[:3])}"
            f"{'...' if len(missing) > 3 else ''}), {len(unexpected)} unexpected ({', '.join(unexpected[:3])}{'...' if len(unexpected) > 3 else ''})"
        )
    wrong = [f"{k} {tuple(arrays[k].shape)} vs {shapes[k]}" for k in names if tuple(arrays[k].shape) != shapes[k]]
    if wrong:
        raise UnitrainError(f"the weights do not fit this model: shapes differ for {len(wrong)} tensor(s), e.g. {wrong[0]}")


@dataclass(frozen=True)
class _Entry:
    module: str
    framework: str
    extra: str


_BACKENDS: Dict[str, _Entry] = {
    "paddle": _Entry("unitrain.backends.paddle", "paddle", "paddle"),
    "torch": _Entry("unitrain.backends.torch", "torch", "torch"),
}
_INSTANCES: Dict[str, Backend] = {}


def available_backends() -> Sequence[str]:
    """Every backend unitrain knows, installed or not."""
    return sorted(_BACKENDS)


def get_backend(name: str) -> Backend:
    """The backend called ``name``, importing its framework on first use."""
    if name not in _BACKENDS:
        raise UnknownNameError("backend", name, _BACKENDS)
    if name not in _INSTANCES:
        entry = _BACKENDS[name]
        try:
            module = importlib.import_module(entry.module)
        except ModuleNotFoundError as err:
            if err.name and err.name.split(".")[0] == entry.framework:
                raise BackendUnavailableError(
                    f"backend {name!r} needs the {entry.framework!r} framework, which is not installed; "
                    f"install it with: pip install 'unitrain[{entry.extra}]'"
                ) from None
            raise
        _INSTANCES[name] = module.Backend()
    return _INSTANCES[name]


def capability(backend: Backend, name: str):
    """The backend's module for a capability (``evaluation``, ...): each capability is a core
    module plus one module of the same name per backend, rather than more Backend methods."""
    return importlib.import_module(f"{_BACKENDS[backend.name].module}.{name}")


def decays(name: str, shape) -> bool:
    """Whether ``optim.decay_norm_and_bias=false`` still decays this parameter: only the conv
    and linear weights do (BatchNorm scales and shifts and biases are 1-D); the same rule on
    both frameworks, whose parameter names line up."""
    return len(shape) > 1
