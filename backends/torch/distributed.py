"""DistributedContext for torch: a torch.distributed process group and DistributedDataParallel.

Rank, world size and local rank come from torchrun, which exports RANK, WORLD_SIZE and
LOCAL_RANK (and MASTER_ADDR/MASTER_PORT for the env:// rendezvous) to every worker it starts.
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as tdist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from unitrain.config.schema import DistConfig
from unitrain.config.validation import check_all_reduce_levers
from unitrain.errors import ConfigError
from unitrain.interface.distributed import NO_COMM_HOOK, DistributedContext

from .validation import check_all_reduce

__all__ = ["make_context"]

#: How long a restarted worker waits for the agent's store.
STORE_TIMEOUT = timedelta(minutes=5)
_OPS = {"sum": tdist.ReduceOp.SUM, "max": tdist.ReduceOp.MAX, "min": tdist.ReduceOp.MIN}
_COMPRESSION_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}


def _convert_sync_batchnorm(model: torch.nn.Module) -> torch.nn.Module:
    """NVIDIA Apex's SyncBatchNorm where apex.parallel is installed, else torch's own."""
    try:
        from apex.parallel import convert_syncbn_model  # noqa: PLC0415 - optional
    except ImportError:
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return convert_syncbn_model(model)


def _uncompiled(model: Any) -> Any:
    """The module inside torch.compile's wrapper (backend.tuned compiles around DDP)."""
    return getattr(model, "_orig_mod", model)


def resolve_device(requested: str, local_rank: int) -> str:
    cuda = torch.cuda.is_available()
    if requested == "gpu" and not cuda:
        raise ConfigError("backend.device", requested, "cpu or auto: torch sees no CUDA device here")
    return f"cuda:{local_rank}" if cuda and requested != "cpu" else "cpu"


class TorchDistributedContext(DistributedContext):
    def __init__(self, cfg: DistConfig | None = None, device: str = "auto"):
        self.cfg = cfg or DistConfig()
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
        super().__init__(resolve_device(device, local_rank), rank, world_size, local_rank)
        default = "nccl" if self.device.startswith("cuda") else "gloo"
        self.comm_backend = default if self.cfg.comm_backend == "auto" else self.cfg.comm_backend
        if self.comm_backend == "nccl" and not self.device.startswith("cuda"):
            raise ConfigError(
                "dist.comm_backend", "nccl", "auto or gloo: nccl needs CUDA devices and this run is on cpu"
            )
        check_all_reduce_levers(self.cfg)
        check_all_reduce(self.cfg)
        if self.cfg.grad_compression == "bf16" and self.comm_backend != "nccl":
            # torch's bf16_compress_hook checks for NCCL 2.10+ (or XPU) and raises otherwise.
            raise ConfigError(
                "dist.grad_compression",
                "bf16",
                f"none or fp16 with {self.comm_backend}: torch's bf16_compress_hook needs NCCL (CUDA)",
            )
        self._ddp: DistributedDataParallel | None = None

    def setup(self) -> "TorchDistributedContext":
        if self.device.startswith("cuda"):
            torch.cuda.set_device(self.device)
        if self.is_distributed and not tdist.is_initialized():
            restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            if restart != "0" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                # A restart (dist.max_restarts) meets in the agent's store that the attempt
                # before it used: gloo would read the dead workers' addresses there and hang.
                # A prefix per attempt keeps each attempt's keys its own.
                store = tdist.TCPStore(
                    os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=STORE_TIMEOUT
                )
                attempt = tdist.PrefixStore(f"unitrain/attempt{restart}", store)
                self._meet_again(attempt, int(restart))
                tdist.init_process_group(
                    backend=self.comm_backend, store=attempt, rank=self.rank, world_size=self.world_size
                )
            else:
                tdist.init_process_group(backend=self.comm_backend, init_method="env://")
        return super().setup()

    def _meet_again(self, store: Any, restart: int) -> None:
        """Every rank of a restart back within dist.timeout_s, or one line: the agent's static
        rendezvous does not wait for the other nodes again, and gloo's own wait is 30 minutes
        (a node whose host is gone never comes back)."""
        store.set(f"back/{self.rank}", "1")
        try:
            store.wait([f"back/{r}" for r in range(self.world_size)], timedelta(seconds=self.cfg.timeout_s))
        except RuntimeError:  # torch's DistStoreError: the wait timed out
            back = [r for r in range(self.world_size) if store.check([f"back/{r}"])]
            # Not a refusal (exit 2): the job failed, its logs are kept.
            raise ConnectionError(
                f"restart {restart}: {len(back)} of the job's {self.world_size} workers came back within "
                f"dist.timeout_s={self.cfg.timeout_s:g}s (ranks {', '.join(map(str, back))}); the others' node is "
                "lost, or its launcher has no restarts left"
            ) from None

    def teardown(self) -> None:
        if tdist.is_initialized() and not self.failed:
            # Every rank past its last collective before any rank destroys the group: gloo
            # aborts the process ("terminate called without an active exception") when its
            # threads still hold work at shutdown (pytorch/pytorch#190489).
            tdist.barrier()
            tdist.destroy_process_group()
        super().teardown()

    def barrier(self) -> None:
        if self.is_distributed:
            tdist.barrier()

    def _all_reduce_array(self, array: np.ndarray, op: str) -> np.ndarray:
        tensor = torch.from_numpy(array.copy()).to(self.device if self.comm_backend == "nccl" else "cpu")
        tdist.all_reduce(tensor, op=_OPS[op])
        return tensor.cpu().numpy()

    def _broadcast_object(self, obj, src: int):
        box = [obj]
        tdist.broadcast_object_list(box, src=src)
        return box[0]

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.cfg.sync_bn:
            if not self.device.startswith("cuda"):
                raise ConfigError("dist.sync_bn", True, "false on cpu: torch's SyncBatchNorm runs on GPUs only")
            model = _convert_sync_batchnorm(model)
        if not self.is_distributed:
            return model
        # DDP broadcasts rank 0's parameters and buffers at construction: all ranks start equal.
        device_ids = [self.local_rank] if self.device.startswith("cuda") else None
        buckets = {} if self.cfg.bucket_cap_mb is None else {"bucket_cap_mb": self.cfg.bucket_cap_mb}
        self._ddp = DistributedDataParallel(model, device_ids=device_ids, **buckets)
        if self.cfg.grad_compression != "none":
            self._ddp.register_comm_hook(None, _COMPRESSION_HOOKS[self.cfg.grad_compression])
        return self._ddp

    def grad_sync(self) -> dict | None:
        """What DDP reports it did: its buckets (rebuilt after the first step in the order
        gradients became ready) and the communication hook in use."""
        if self._ddp is None:
            return None
        data = self._ddp._get_ddp_logging_data()
        # The logging data keeps the buckets of construction; the reducer's are the current ones.
        sizes = [
            b.buffer().numel() * b.buffer().element_size() for b in self._ddp.reducer._get_zeros_like_grad_buckets()
        ]
        return {
            "buckets": len(sizes),
            "bucket_mb": [round(b / 2**20, 2) for b in sizes],
            "bucket_cap_mb": data.get("bucket_cap_bytes", 0) / 2**20,
            "comm_hook": data.get("comm_hook") or NO_COMM_HOOK,
        }

    @contextlib.contextmanager
    def no_sync(self, model: Any) -> Iterator[None]:
        model = _uncompiled(model)
        if isinstance(model, DistributedDataParallel):
            with model.no_sync():
                yield
        else:
            yield


def make_context(cfg: DistConfig | None, device: str) -> TorchDistributedContext:
    return TorchDistributedContext(cfg, device)
