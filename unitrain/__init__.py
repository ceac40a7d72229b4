"""unitrain: one training job, PaddlePaddle or PyTorch, compared honestly.

This package imports no framework: ``get_backend(name)`` imports one when asked.

``Profiler`` is the step timer (reader_cost, batch_cost, ips per step: the seed's timer-only
profiler, named so by the design card), not a framework's trace, which ``profiler=trace`` writes.
"""

from unitrain.config.schema import AmpConfig, DataConfig, DistConfig, ModelConfig, OptimConfig, TrainerConfig
from unitrain.data.datasets import ImageFolderDataset, LearnableDataset, SyntheticDataset
from unitrain.data.sampler import DistributedBatchSampler
from unitrain.errors import BackendUnavailableError, ConfigError, UnitrainError, UnknownNameError
from unitrain.host.machine import unitrain_version
from unitrain.interface.backend import Backend, get_backend
from unitrain.interface.distributed import DistributedContext
from unitrain.interface.modules import available_backends
from unitrain.interface.precision import MixedPrecision
from unitrain.model.build import build_model
from unitrain.model.custom import CustomModel
from unitrain.train.step_timer import Profiler  # the step timer, not a framework's trace

__version__ = unitrain_version()

__all__ = [
    "AmpConfig",
    "Backend",
    "BackendUnavailableError",
    "ConfigError",
    "CustomModel",
    "DataConfig",
    "DistConfig",
    "DistributedBatchSampler",
    "DistributedContext",
    "ImageFolderDataset",
    "LearnableDataset",
    "MixedPrecision",
    "ModelConfig",
    "OptimConfig",
    "Profiler",
    "SyntheticDataset",
    "TrainerConfig",
    "UnitrainError",
    "UnknownNameError",
    "available_backends",
    "build_model",
    "get_backend",
]
