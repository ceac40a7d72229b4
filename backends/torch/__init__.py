"""The PyTorch backend: torch.nn models, torch.utils.data loaders, DDP, torch.amp."""

from unitrain.backends.torch.backend import TorchBackend as Backend

__all__ = ["Backend"]
