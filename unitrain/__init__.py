"""unitrain: one training job, PaddlePaddle or PyTorch, compared honestly.

This package imports no framework: ``get_backend(name)`` imports one when asked.
"""

from unitrain.backend import Backend, available_backends, get_backend
from unitrain.config import AmpConfig, DataConfig, DistConfig, ModelConfig, OptimConfig, TrainerConfig
from unitrain.data import ImageFolderDataset, LearnableDataset, SyntheticDataset
from unitrain.distributed import DistributedContext
from unitrain.errors import BackendUnavailableError, ConfigError, UnitrainError, UnknownNameError
from unitrain.precision import MixedPrecision
from unitrain.profiler import Profiler
from unitrain.sampler import DistributedBatchSampler

__version__ = "0.1.0"

__all__ = [
    "AmpConfig",
    "Backend",
    "BackendUnavailableError",
    "ConfigError",
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
    "get_backend",
]
