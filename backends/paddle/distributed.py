"""DistributedContext for paddle: Fleet in collective mode.

Rank, world size and local rank come from paddle.distributed.launch, which exports
PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM and PADDLE_LOCAL_RANK to every worker it starts.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Iterator

import numpy as np
import paddle
import paddle.distributed as pdist
from paddle.distributed import fleet

from unitrain.config.schema import DistConfig
from unitrain.config.validation import check_all_reduce_levers
from unitrain.errors import ConfigError
from unitrain.interface.distributed import NO_COMM_HOOK, DistributedContext

from .validation import check_all_reduce

__all__ = ["make_context"]

_OPS = {"sum": pdist.ReduceOp.SUM, "max": pdist.ReduceOp.MAX, "min": pdist.ReduceOp.MIN}


def resolve_device(requested: str, local_rank: int) -> str:
    gpu = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if requested == "gpu" and not gpu:
        raise ConfigError("backend.device", requested, "cpu or auto: paddle sees no GPU here (CPU build or no device)")
    return f"gpu:{local_rank}" if gpu and requested != "cpu" else "cpu"


class PaddleDistributedContext(DistributedContext):
    def __init__(self, cfg: DistConfig | None = None, device: str = "auto"):
        self.cfg = cfg or DistConfig()
        world_size = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
        rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
        local_rank = int(os.environ.get("PADDLE_LOCAL_RANK", os.environ.get("PADDLE_RANK_IN_NODE", "0")))
        super().__init__(resolve_device(device, local_rank), rank, world_size, local_rank)
        # Fleet picks the communication library from the device; it cannot be chosen apart.
        self.comm_backend = "nccl" if self.device.startswith("gpu") else "gloo"
        if self.cfg.comm_backend not in ("auto", self.comm_backend):
            raise ConfigError(
                "dist.comm_backend",
                self.cfg.comm_backend,
                f"auto or {self.comm_backend}: paddle uses {self.comm_backend} on {self.device}",
            )
        check_all_reduce_levers(self.cfg)
        check_all_reduce(self.cfg)
        self._data_parallel: paddle.DataParallel | None = None

    def setup(self) -> "PaddleDistributedContext":
        paddle.set_device(self.device)
        if self.is_distributed:
            strategy = fleet.DistributedStrategy()
            if self.cfg.bucket_cap_mb is not None:
                # fleet.distributed_model hands it to paddle.DataParallel as comm_buffer_size.
                strategy.fuse_grad_size_in_MB = int(self.cfg.bucket_cap_mb)
            fleet.init(is_collective=True, strategy=strategy)
        return super().setup()

    def teardown(self) -> None:
        if self.is_distributed and self._active and not self.failed:
            pdist.barrier()
            pdist.destroy_process_group()
        super().teardown()

    def barrier(self) -> None:
        if self.is_distributed:
            pdist.barrier()

    def _all_reduce_array(self, array: np.ndarray, op: str) -> np.ndarray:
        tensor = paddle.to_tensor(array)
        pdist.all_reduce(tensor, op=_OPS[op])
        return tensor.numpy()

    def _broadcast_object(self, obj, src: int):
        box = [obj]
        pdist.broadcast_object_list(box, src=src)
        return box[0]

    def wrap_model(self, model: paddle.nn.Layer) -> paddle.nn.Layer:
        if self.cfg.sync_bn:
            if not self.device.startswith("gpu"):
                raise ConfigError("dist.sync_bn", True, "false on cpu: paddle has no SyncBatchNorm kernel for the CPU")
            model = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        # fleet.distributed_model at world size 1 fails in paddle 3.3.1 (it expects a
        # PipelineLayer), so wrap only when there is something to synchronise.
        if not self.is_distributed:
            return model
        # paddle.DataParallel broadcasts rank 0's parameters at construction: all ranks start equal.
        self._data_parallel = fleet.distributed_model(model)
        return self._data_parallel

    def grad_sync(self) -> dict | None:
        """The all-reduce groups DataParallel made (its group_indices over the trainable
        parameters, in the order its init_reducer lists them) and their sizes."""
        dp = self._data_parallel
        if not isinstance(dp, paddle.DataParallel) or not hasattr(dp, "group_indices"):
            return None
        params, seen = [], set()
        for layer in dp.sublayers():
            for _, p in layer.named_parameters(include_sublayers=False):
                if p is not None and id(p) not in seen and p.trainable and not getattr(p, "no_sync", False):
                    seen.add(id(p))
                    params.append(p)
        sizes = [
            sum(math.prod(params[i].shape) * params[i].element_size() for i in group) for group in dp.group_indices
        ]
        return {
            "buckets": len(sizes),
            "bucket_mb": [round(b / 2**20, 2) for b in sizes],
            "bucket_cap_mb": dp.comm_buffer_size / 2**20,
            "comm_hook": NO_COMM_HOOK,
        }

    def wrap_optimizer(self, optimizer):
        return fleet.distributed_optimizer(optimizer) if self.is_distributed else optimizer

    @contextlib.contextmanager
    def no_sync(self, model: Any) -> Iterator[None]:
        if isinstance(model, paddle.DataParallel):
            with model.no_sync():
                yield
        else:
            yield


def make_context(cfg: DistConfig | None, device: str) -> PaddleDistributedContext:
    return PaddleDistributedContext(cfg, device)
