"""Parameter servers on torch.distributed.rpc, PyTorch's own engine for the pattern.

As in PyTorch's examples: the embedding tables live on the server processes, the dense tower
is data parallel over the trainers (DistributedDataParallel on a process group of the
trainers only), and

* async follows "Combining DDP with the Distributed RPC Framework": each server's tables are a
  ``RemoteModule``; a trainer's step runs inside ``dist_autograd.context()`` and
  ``DistributedOptimizer`` applies its gradients on the servers as they arrive;
* sync follows the batch-updating parameter server (``@rpc.functions.async_execution``): a
  server holds each trainer's sparse gradients until all trainers' arrived, applies their mean
  once and only then answers.

Ids are spread over the servers by ``id % servers`` (row ``id // servers`` on that server).
Geo-SGD has no torch counterpart; the config refuses it.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import torch
import torch.distributed as tdist
import torch.nn as nn
import torch.nn.functional as F

from unitrain.data.criteo import SPARSE_SLOTS, CtrData
from unitrain.data.criteo_files import Share
from unitrain.errors import Refusal, UnitrainError
from unitrain.interface.ps import PsProgram, Role
from unitrain.ps.model import EMBED_INIT, tower_init

__all__ = ["build", "engine_problem"]

# Seconds an RPC may take before it fails: long enough for a synchronous step that waits for
# the slowest trainer, short enough that a dead server does not hold a trainer for minutes.
RPC_TIMEOUT_S = 60.0
RPC_THREADS = 4


def engine_problem() -> Optional[str]:
    from torch.distributed import rpc

    return (
        None
        if rpc.is_available()
        else f"torch {torch.__version__} was built without torch.distributed.rpc, which parameter-server jobs use"
    )


class Tower(nn.Module):
    """The dense part: the deep tower over [dense features, embeddings] plus the wide part's
    linear term on the dense features, from the shared NumPy initial weights."""

    def __init__(self, cfg):
        super().__init__()
        *deep, wide = tower_init(cfg)
        self.deep = nn.ModuleList(_linear(w, b) for w, b in deep)
        self.wide_dense = _linear(*wide)

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor, wide_sparse: torch.Tensor) -> torch.Tensor:
        x = torch.cat([dense, embedded], dim=1)
        for i, layer in enumerate(self.deep):
            x = layer(x)
            if i < len(self.deep) - 1:
                x = F.relu(x)
        return (x + self.wide_dense(dense)).squeeze(1) + wide_sparse


def _linear(weight: np.ndarray, bias: np.ndarray) -> nn.Linear:
    layer = nn.Linear(*weight.shape)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight.T.copy()))
        layer.bias.copy_(torch.from_numpy(bias))
    return layer


class Tables(nn.Module):
    """One server's rows of both tables, as one [rows, dim + 1] lookup (deep | wide)."""

    def __init__(self, rows: int, dim: int, seed: int, index: int):
        super().__init__()
        rng = np.random.default_rng((seed, 4, index))
        self.rows = nn.Embedding(rows, dim + 1, sparse=True)
        with torch.no_grad():
            self.rows.weight.copy_(
                torch.from_numpy(rng.uniform(-EMBED_INIT, EMBED_INIT, (rows, dim + 1)).astype(np.float32))
            )
        self.looked_up = 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.looked_up += len(ids)
        return self.rows(ids)


def _optimizer_class(name: str):
    return torch.optim.Adagrad if name == "adagrad" else torch.optim.SGD


class _Server:
    """A server's state; RPC handlers are module functions, so it is a module global."""

    def __init__(self, cfg, role: Role):
        rows = math.ceil(cfg.model.sparse_buckets / role.servers)
        self.tables = Tables(rows, cfg.model.embedding_dim, cfg.trainer.seed, role.index)
        self.optimizer = _optimizer_class(cfg.optim.name)(self.tables.parameters(), lr=cfg.optim.lr)
        self.trainers = role.trainers
        self.lock = threading.Lock()
        self.pending: List[tuple] = []
        self.applied = torch.futures.Future()
        self.updates = 0
        self.rows_pushed = 0
        self.rows_pulled = 0


_SERVER: Optional[_Server] = None


def _tables_rref():
    from torch.distributed import rpc

    return rpc.RRef(_SERVER.tables)


def _pull(ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        _SERVER.rows_pulled += len(ids)
        return _SERVER.tables.rows.weight[ids].clone()


def _traffic() -> Dict[str, int]:
    return {
        "updates": _SERVER.updates,
        "rows_pushed": _SERVER.rows_pushed,
        "rows_pulled": _SERVER.rows_pulled + _SERVER.tables.looked_up,
    }


def _push_when_all_arrived(ids: torch.Tensor, grads: torch.Tensor):
    """Hold a trainer's sparse gradient until every trainer's for this step arrived; then apply
    their mean once and release all of them."""
    server = _SERVER
    with server.lock:
        server.pending.append((ids, grads))
        server.rows_pushed += len(ids)
        applied = server.applied
        if len(server.pending) == server.trainers:
            weight = server.tables.rows.weight
            # Each trainer's loss is its own batch's mean: the job's gradient is their mean.
            all_ids = torch.cat([i for i, _ in server.pending])
            values = torch.cat([g for _, g in server.pending]) / server.trainers
            weight.grad = torch.sparse_coo_tensor(
                all_ids[None], values, weight.shape, check_invariants=False
            ).coalesce()
            server.optimizer.step()
            weight.grad = None
            server.pending, server.applied = [], torch.futures.Future()
            server.updates += 1
            applied.set_result(None)
    return applied


def _install_async_execution():
    from torch.distributed import rpc

    global _push_when_all_arrived
    _push_when_all_arrived = rpc.functions.async_execution(_push_when_all_arrived)


_install_async_execution()


def _split(ids: np.ndarray, servers: int):
    """For each server, the positions of the batch's ids it holds and their rows there."""
    flat = torch.from_numpy(ids.reshape(-1))
    parts = []
    for j in range(servers):
        positions = torch.nonzero(flat % servers == j).squeeze(1)
        parts.append((positions, flat[positions] // servers))
    return parts


def _assemble(parts, rows: List[torch.Tensor], batch: int, dim: int):
    """Rows fetched per server back in batch order: the deep embeddings [B, 26*dim] and the
    wide part's sum over the slots [B]."""
    positions = torch.cat([p for p, _ in parts])
    ordered = torch.cat(rows)[torch.argsort(positions)].reshape(batch, SPARSE_SLOTS, dim + 1)
    return ordered[..., :dim].reshape(batch, -1), ordered[..., dim].sum(dim=1)


class _Stream(torch.utils.data.IterableDataset):
    """A trainer's share for torch's DataLoader: each loader worker parses every n-th batch,
    and the loader takes them from the workers in turn, so the order is the share's."""

    def __init__(self, share: Share, batch_size: int):
        super().__init__()
        self.share, self.batch_size = share, batch_size

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        try:
            for batch in self.share.batches(self.batch_size, worker, workers):
                yield batch.dense, batch.sparse, batch.label
        except UnitrainError as err:
            # The loader would wrap it in a worker traceback; the trainer re-raises it as one line.
            yield str(err)


class TorchPs(PsProgram):
    def __init__(self, cfg, role: Role):
        global _SERVER
        self.cfg, self.role, self.dim = cfg, role, cfg.model.embedding_dim
        self.sync = "local" if role.servers == 0 else cfg.dist.ps.sync
        self.tower: Optional[nn.Module] = None
        self.rpc = None
        if role.servers == 0:
            self.tables = Tables(cfg.model.sparse_buckets, self.dim, cfg.trainer.seed, 0)
            self.tower = Tower(cfg)
            params = list(self.tables.parameters()) + list(self.tower.parameters())
            self.optimizer = _optimizer_class(cfg.optim.name)(params, lr=cfg.optim.lr)
            return
        from torch.distributed import rpc

        self.rpc = rpc
        world = role.servers + role.trainers
        # Every process joins the default group (new_group must be called by all of them); the
        # trainers' own group carries DDP's all-reduce of the dense tower.
        tdist.init_process_group("gloo", init_method="env://", rank=role.rank, world_size=world)
        self.trainer_group = tdist.new_group(list(range(role.servers, world)))
        if role.kind == "server":
            _SERVER = _Server(cfg, role)
        # uv (TCP) alone: TensorPipe's default shared-memory transport keeps a thread spinning
        # at about half a core in every process, idle or not, which a 2-core machine cannot spare.
        # A few RPC threads: 16 by default, for 1-thread processes.
        options = rpc.TensorPipeRpcBackendOptions(
            num_worker_threads=RPC_THREADS, rpc_timeout=RPC_TIMEOUT_S, _transports=["uv"]
        )
        rpc.init_rpc(f"{role.kind}{role.index}", rank=role.rank, world_size=world, rpc_backend_options=options)
        if role.kind == "server":
            return
        from torch.nn.parallel import DistributedDataParallel

        self.servers = [f"server{j}" for j in range(role.servers)]
        self.tower = Tower(cfg)
        self.ddp = DistributedDataParallel(self.tower, process_group=self.trainer_group)
        if self.sync == "async":
            from torch.distributed.nn import RemoteModule
            from torch.distributed.optim import DistributedOptimizer

            self.remote = [
                RemoteModule.init_from_module_rref(f"{s}/cpu", rpc.rpc_sync(s, _tables_rref)) for s in self.servers
            ]
            params = [p for m in self.remote for p in m.remote_parameters()] + [
                rpc.RRef(p) for p in self.ddp.parameters()
            ]
            self.optimizer = DistributedOptimizer(_optimizer_class(cfg.optim.name), params, lr=cfg.optim.lr)
        else:
            self.optimizer = _optimizer_class(cfg.optim.name)(self.ddp.parameters(), lr=cfg.optim.lr)

    # --- serving ---------------------------------------------------------------------------
    def run_server(self) -> None:
        # rpc.shutdown is a barrier over every RPC process: it returns once the trainers have
        # called it too, serving their requests meanwhile.
        self.rpc.shutdown()
        self.rpc = None

    # --- training --------------------------------------------------------------------------
    def batches(self, share: Share, batch_size: int, workers: int) -> Iterator[CtrData]:
        if workers == 0:
            yield from share.batches(batch_size)
            return
        loader = torch.utils.data.DataLoader(_Stream(share, batch_size), batch_size=None, num_workers=workers)
        for item in loader:
            if isinstance(item, str):
                raise Refusal(item)
            yield CtrData(*(t.numpy() for t in item))

    def _lookup_remote_async(self, ids: np.ndarray, batch: int):
        parts = _split(ids, len(self.servers))
        futures = [m.forward_async(rows) for m, (_, rows) in zip(self.remote, parts)]
        return _assemble(parts, [f.wait() for f in futures], batch, self.dim)

    def train_batch(self, batch: CtrData) -> float:
        dense, labels, n = torch.from_numpy(batch.dense), torch.from_numpy(batch.label), len(batch)
        if self.sync == "local":
            embedded, wide = _assemble(*self._local_parts(batch.sparse), n, self.dim)
            loss = F.binary_cross_entropy_with_logits(self.tower(dense, embedded, wide), labels)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            return float(loss)
        if self.sync == "async":
            import torch.distributed.autograd as dist_autograd

            with dist_autograd.context() as context:
                embedded, wide = self._lookup_remote_async(batch.sparse, n)
                loss = F.binary_cross_entropy_with_logits(self.ddp(dense, embedded, wide), labels)
                dist_autograd.backward(context, [loss])
                self.optimizer.step(context)
            return float(loss)
        # sync: pull the batch's unique rows, train on them as leaves, push their gradients.
        parts = _split(batch.sparse, len(self.servers))
        uniques = [torch.unique(rows, return_inverse=True) for _, rows in parts]
        pulled = [self.rpc.rpc_async(s, _pull, args=(u,)) for s, (u, _) in zip(self.servers, uniques)]
        leaves = [f.wait().requires_grad_() for f in pulled]
        rows = [leaf[inverse] for leaf, (_, inverse) in zip(leaves, uniques)]
        embedded, wide = _assemble(parts, rows, n, self.dim)
        loss = F.binary_cross_entropy_with_logits(self.ddp(dense, embedded, wide), labels)
        self.optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the tower's gradients over the trainers here
        self.optimizer.step()
        pushed = [
            self.rpc.rpc_async(s, _push_when_all_arrived, args=(u, leaf.grad))
            for s, (u, _), leaf in zip(self.servers, uniques, leaves)
        ]
        for f in pushed:
            f.wait()
        return float(loss)

    def _local_parts(self, ids: np.ndarray):
        flat = torch.from_numpy(ids.reshape(-1))
        return [(torch.arange(len(flat)), flat)], [self.tables(flat)]

    def predict(self, batch: CtrData) -> np.ndarray:
        dense, n = torch.from_numpy(batch.dense), len(batch)
        with torch.no_grad():
            if self.sync == "local":
                embedded, wide = _assemble(*self._local_parts(batch.sparse), n, self.dim)
            else:
                parts = _split(batch.sparse, len(self.servers))
                rows = [
                    f.wait()
                    for f in [self.rpc.rpc_async(s, _pull, args=(r,)) for s, (_, r) in zip(self.servers, parts)]
                ]
                embedded, wide = _assemble(parts, rows, n, self.dim)
            return torch.sigmoid(self.tower(dense, embedded, wide)).numpy()

    def end_training(self) -> None:
        if self.rpc is not None:
            tdist.barrier(group=self.trainer_group)

    def observed(self) -> Dict[str, Any]:
        if self.rpc is None:
            return {"engine": "none (one process)", "sync": "local"}
        traffic = [self.rpc.rpc_sync(s, _traffic) for s in self.servers]
        # Counted on the servers: rows sent to trainers, rows of gradient received and updates
        # applied in sync mode (each held every trainer's gradients). In async mode
        # DistributedOptimizer applies the gradients itself, and torch does not count them.
        return {
            "engine": f"torch.distributed.rpc (TensorPipe), torch {torch.__version__}",
            "sync": self.sync,
            "dense": "DistributedDataParallel over the trainers",
            "traffic": {
                "rows_pulled": sum(t["rows_pulled"] for t in traffic),
                **(
                    {
                        "rows_pushed": sum(t["rows_pushed"] for t in traffic),
                        "synchronous_updates": sum(t["updates"] for t in traffic),
                    }
                    if self.sync == "sync"
                    else {}
                ),
            },
        }

    def close(self) -> None:
        if self.rpc is not None:
            self.rpc.shutdown()
            self.rpc = None
        if tdist.is_initialized():
            tdist.destroy_process_group()


def build(cfg, role: Role) -> TorchPs:
    return TorchPs(cfg, role)
