"""DistributedContext for paddle: Fleet in collective mode."""

from __future__ import annotations

import os

import paddle

from unitrain.config import DistConfig
from unitrain.distributed import DistributedContext
from unitrain.errors import ConfigError, NotImplementedYetError


def resolve_device(requested: str, local_rank: int) -> str:
    gpu = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if requested == "gpu" and not gpu:
        raise ConfigError("backend.device", requested, "cpu or auto: paddle sees no GPU here (CPU build or no device)")
    return f"gpu:{local_rank}" if gpu and requested != "cpu" else "cpu"


class PaddleDistributedContext(DistributedContext):
    def __init__(self, cfg: DistConfig | None = None, device: str = "auto"):
        self.cfg = cfg or DistConfig()
        # paddle.distributed.launch's contract: it exports these to every worker it starts.
        world_size = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
        rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
        local_rank = int(os.environ.get("PADDLE_LOCAL_RANK", os.environ.get("PADDLE_RANK_IN_NODE", "0")))
        super().__init__(resolve_device(device, local_rank), rank, world_size, local_rank)

    def setup(self) -> "PaddleDistributedContext":
        if self.world_size > 1:
            raise NotImplementedYetError(
                "data-parallel training (world size > 1) is not implemented yet (issue #3); run with dist.nproc_per_node=1"
            )
        paddle.set_device(self.device)
        return super().setup()
