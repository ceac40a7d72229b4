"""DistributedContext for torch: the process group and DistributedDataParallel."""

from __future__ import annotations

import os

import torch

from unitrain.config import DistConfig
from unitrain.distributed import DistributedContext
from unitrain.errors import ConfigError, NotImplementedYetError


def resolve_device(requested: str, local_rank: int) -> str:
    cuda = torch.cuda.is_available()
    if requested == "gpu" and not cuda:
        raise ConfigError("backend.device", requested, "cpu or auto: torch sees no CUDA device here")
    return f"cuda:{local_rank}" if cuda and requested != "cpu" else "cpu"


class TorchDistributedContext(DistributedContext):
    def __init__(self, cfg: DistConfig | None = None, device: str = "auto"):
        self.cfg = cfg or DistConfig()
        # torchrun's contract: it exports these to every worker it starts.
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
        super().__init__(resolve_device(device, local_rank), rank, world_size, local_rank)

    def setup(self) -> "TorchDistributedContext":
        if self.world_size > 1:
            raise NotImplementedYetError(
                "data-parallel training (world size > 1) is not implemented yet (issue #3); run with dist.nproc_per_node=1"
            )
        if self.device.startswith("cuda"):
            torch.cuda.set_device(self.device)
        return super().setup()
