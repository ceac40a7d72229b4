"""Parameter servers on torch.distributed.rpc, PyTorch's own engine for the pattern, as in its
batch-updating parameter-server example (``@rpc.functions.async_execution``).

The sparse tables live on the server processes (:class:`unitrain.spec.ps_table.SparseTable`: a row
is created when its id is first seen, and updated by the same rule as Paddle's servers). A
trainer pulls the batch's unique rows, trains on them as leaves and pushes their gradients.

* sync: a server holds each trainer's row gradients until every trainer's arrived, applies
  their mean once and only then answers; the dense tower is data parallel over the trainers
  (DistributedDataParallel on a process group of the trainers only).
* async: a server applies each push as it arrives, and the dense tower lives on server 0,
  pulled before each step and its gradients pushed after it: no trainer waits for another.

Ids are spread over the servers by ``id % servers``. Geo-SGD has no torch counterpart; the
config refuses it.
"""

from __future__ import annotations

import threading
from pathlib import Path
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
from unitrain.spec.ps_model import EMBED_INIT, tower_init
from unitrain.spec.ps_table import SparseTable

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


def _dense_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    return {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}[name](params, lr=lr)


def new_table(cfg) -> SparseTable:
    """Both tables as one (deep | wide): a row is ``embedding_dim + 1`` values."""
    return SparseTable(
        width=cfg.model.embedding_dim + 1,
        rule=cfg.optim.name,
        lr=cfg.optim.lr,
        seed=cfg.trainer.seed,
        init_scale=EMBED_INIT,
    )


class _Server:
    """A server's state; RPC handlers are module functions, so it is a module global. Server 0
    also holds the dense tower in async mode, where no trainer waits for another."""

    def __init__(self, cfg, role: Role, resume: Optional[Path]):
        self.index = role.index
        self.table = new_table(cfg)
        self.tower: Optional[Tower] = None
        if role.index == 0 and cfg.dist.ps.sync == "async":
            self.tower = Tower(cfg)
            self.tower_optimizer = _dense_optimizer(cfg.optim.name, self.tower.parameters(), cfg.optim.lr)
        if resume is not None:
            _load_tables(self.table, resume, role.index, role.servers)
            if self.tower is not None:
                _load_dense(resume, self.tower, self.tower_optimizer)
        self.trainers = role.trainers
        self.lock = threading.Lock()
        self.pending: List[tuple] = []
        self.applied = torch.futures.Future()
        self.updates = self.dense_updates = 0
        self.rows_pushed = self.rows_pulled = 0


_SERVER: Optional[_Server] = None


def _pull(ids: torch.Tensor) -> torch.Tensor:
    with _SERVER.lock:
        _SERVER.rows_pulled += len(ids)
        return torch.from_numpy(_SERVER.table.pull(ids.numpy()))


def _peek(ids: torch.Tensor) -> torch.Tensor:
    """Rows for prediction: an id never trained on gets its initial row, and no row is created."""
    with _SERVER.lock:
        return torch.from_numpy(_SERVER.table.peek(ids.numpy()))


def _push(ids: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, pushed: int) -> None:
    """Apply one trainer's row gradients as they arrive (async)."""
    with _SERVER.lock:
        _SERVER.rows_pushed += len(ids)
        _SERVER.table.push(ids.numpy(), grads.numpy(), counts.numpy(), pushed)
        _SERVER.updates += 1


def _push_when_all_arrived(ids: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, pushed: int, trainer: int):
    """Hold a trainer's row gradients until every trainer's for this step arrived; then apply
    their mean once and release all of them (sync). Summed in trainer order, not arrival
    order: the result does not depend on which trainer was first."""
    server = _SERVER
    with server.lock:
        server.pending.append((ids, grads, counts, pushed, trainer))
        server.rows_pushed += len(ids)
        applied = server.applied
        if len(server.pending) == server.trainers:
            server.pending.sort(key=lambda p: p[4])
            # Each trainer's loss is its own batch's mean: the job's gradient is their mean.
            all_ids, inverse = torch.unique(torch.cat([p[0] for p in server.pending]), return_inverse=True)
            grads = torch.zeros(len(all_ids), server.table.width).index_add_(
                0, inverse, torch.cat([p[1] for p in server.pending])
            )
            counts = torch.zeros(len(all_ids), dtype=torch.int64).index_add_(
                0, inverse, torch.cat([p[2] for p in server.pending])
            )
            total = sum(p[3] for p in server.pending)
            server.table.push(all_ids.numpy(), (grads / server.trainers).numpy(), counts.numpy(), total)
            server.pending, server.applied = [], torch.futures.Future()
            server.updates += 1
            applied.set_result(None)
    return applied


def _pull_dense() -> List[torch.Tensor]:
    with _SERVER.lock:
        return [p.detach().clone() for p in _SERVER.tower.parameters()]


def _push_dense(grads: List[torch.Tensor]) -> None:
    server = _SERVER
    with server.lock:
        for param, grad in zip(server.tower.parameters(), grads):
            param.grad = grad
        server.tower_optimizer.step()
        server.dense_updates += 1


TABLE_FILE, DENSE_FILE = "table.{}.npz", "dense.pt"


def _save_dense(folder: Path, tower: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    torch.save({"tower": tower.state_dict(), "optimizer": optimizer.state_dict()}, folder / DENSE_FILE)


def _load_dense(folder: Path, tower: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    state = torch.load(folder / DENSE_FILE, weights_only=True)
    tower.load_state_dict(state["tower"])
    optimizer.load_state_dict(state["optimizer"])


def _load_tables(table: SparseTable, folder: Path, index: int, servers: int) -> None:
    """This server's ids (id modulo the servers) from every server's saved table."""
    for path in sorted(folder.glob(TABLE_FILE.format("*"))):
        with np.load(path) as saved:
            arrays = {k: saved[k] for k in saved.files}
        table.add(arrays, arrays["ids"] % servers == index)


def _save(folder: str) -> None:
    """A server's table (and server 0's dense tower in async mode) into ``folder``."""
    server = _SERVER
    with server.lock:
        np.savez(Path(folder) / TABLE_FILE.format(server.index), **server.table.arrays())
        if server.tower is not None:
            _save_dense(Path(folder), server.tower, server.tower_optimizer)


def _stats() -> Dict[str, int]:
    server = _SERVER
    return {
        "updates": server.updates,
        "dense_updates": server.dense_updates,
        "rows_pushed": server.rows_pushed,
        "rows_pulled": server.rows_pulled,
        "table_rows": server.table.rows,
        "table_bytes": server.table.nbytes,
    }


def _install_async_execution():
    from torch.distributed import rpc

    global _push_when_all_arrived
    _push_when_all_arrived = rpc.functions.async_execution(_push_when_all_arrived)


_install_async_execution()


def _split(ids: np.ndarray, servers: int):
    """For each server, the positions of the batch's ids it holds (ids are spread by id modulo
    the servers) and, of those, the unique ids, each occurrence's index among them and each
    unique id's count."""
    flat = torch.from_numpy(ids.reshape(-1))
    parts = []
    for j in range(servers):
        positions = torch.nonzero(flat % servers == j).squeeze(1) if servers > 1 else torch.arange(len(flat))
        unique, inverse, counts = torch.unique(flat[positions], return_inverse=True, return_counts=True)
        parts.append((positions, unique, inverse, counts))
    return parts


def _assemble(parts, rows: List[torch.Tensor], batch: int, dim: int):
    """Rows (each part's occurrences, in its positions' order) back in batch order: the deep
    embeddings [B, 26*dim] and the wide part's sum over the slots [B]."""
    positions = torch.cat([p[0] for p in parts])
    ordered = torch.cat(rows)[torch.argsort(positions)].reshape(batch, SPARSE_SLOTS, dim + 1)
    return ordered[..., :dim].reshape(batch, -1), ordered[..., dim].sum(dim=1)


class _Stream(torch.utils.data.IterableDataset):
    """A trainer's share for torch's DataLoader: each loader worker parses every n-th batch,
    and the loader takes them from the workers in turn, so the order is the share's."""

    def __init__(self, share: Share, batch_size: int, skip: int):
        super().__init__()
        self.share, self.batch_size, self.skip = share, batch_size, skip

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        try:
            for batch in self.share.batches(self.batch_size, worker, workers, self.skip):
                yield batch.dense, batch.sparse, batch.label
        except UnitrainError as err:
            # The loader would wrap it in a worker traceback; the trainer re-raises it as one line.
            yield str(err)


class TorchPs(PsProgram):
    def __init__(self, cfg, role: Role, resume: Optional[Path]):
        global _SERVER
        self.cfg, self.role, self.dim = cfg, role, cfg.model.embedding_dim
        self.sync = "local" if role.servers == 0 else cfg.dist.ps.sync
        self.rpc = None
        self.pending: List[Any] = []
        if role.servers == 0:
            self.table = new_table(cfg)
            self.tower = Tower(cfg)
            self.model = self.tower
            self.optimizer = _dense_optimizer(cfg.optim.name, self.tower.parameters(), cfg.optim.lr)
            if resume is not None:
                _load_tables(self.table, resume, 0, 1)
                _load_dense(resume, self.tower, self.optimizer)
            return
        from torch.distributed import rpc

        self.rpc = rpc
        world = role.servers + role.trainers
        # Every process joins the default group (new_group must be called by all of them); the
        # trainers' own group carries the sync mode's all-reduce and the final barrier.
        tdist.init_process_group("gloo", init_method="env://", rank=role.rank, world_size=world)
        self.trainer_group = tdist.new_group(list(range(role.servers, world)))
        if role.kind == "server":
            _SERVER = _Server(cfg, role, resume)
        # uv (TCP) alone: TensorPipe's default shared-memory transport keeps a thread spinning
        # at about half a core in every process, idle or not, which a 2-core machine cannot spare.
        # A few RPC threads: 16 by default, for 1-thread processes. Over several nodes, tensors
        # go over that TCP too: TensorPipe's cross-memory-attach channel reads a peer's memory
        # directly whenever it shares this kernel, as hosts made of network namespaces do.
        channels = {"_channels": ["basic"]} if cfg.dist.nnodes > 1 else {}
        options = rpc.TensorPipeRpcBackendOptions(
            num_worker_threads=RPC_THREADS, rpc_timeout=RPC_TIMEOUT_S, _transports=["uv"], **channels
        )
        rpc.init_rpc(f"{role.kind}{role.index}", rank=role.rank, world_size=world, rpc_backend_options=options)
        if role.kind == "server":
            return
        self.servers = [f"server{j}" for j in range(role.servers)]
        self.tower = Tower(cfg)
        if self.sync == "sync":
            from torch.nn.parallel import DistributedDataParallel

            # The mean of the trainers' dense gradients, applied by each trainer's identical copy.
            self.model = DistributedDataParallel(self.tower, process_group=self.trainer_group)
            self.optimizer = _dense_optimizer(cfg.optim.name, self.model.parameters(), cfg.optim.lr)
            if resume is not None:
                _load_dense(resume, self.tower, self.optimizer)
        else:
            self.model = self.tower  # its values come from server 0 before every step

    # --- serving ---------------------------------------------------------------------------
    def run_server(self) -> None:
        # rpc.shutdown is a barrier over every RPC process: it returns once the trainers have
        # called it too, serving their requests meanwhile.
        self.rpc.shutdown()
        self.rpc = None

    # --- training --------------------------------------------------------------------------
    def batches(self, share: Share, batch_size: int, workers: int, skip: int = 0) -> Iterator[CtrData]:
        if workers == 0:
            yield from share.batches(batch_size, skip=skip)
            return
        loader = torch.utils.data.DataLoader(_Stream(share, batch_size, skip), batch_size=None, num_workers=workers)
        for item in loader:
            if isinstance(item, str):
                raise Refusal(item)
            yield CtrData(*(t.numpy() for t in item))

    def _rows(self, parts, train: bool) -> List[torch.Tensor]:
        """Each part's unique rows, from this process's table or its server."""
        if self.rpc is None:
            get = self.table.pull if train else self.table.peek
            return [torch.from_numpy(get(unique.numpy())) for _, unique, _, _ in parts]
        handler = _pull if train else _peek
        futures = [self.rpc.rpc_async(s, handler, args=(unique,)) for s, (_, unique, _, _) in zip(self.servers, parts)]
        return [f.wait() for f in futures]

    def train_batch(self, batch: CtrData) -> float:
        self._check_pushes()
        dense, labels, n = torch.from_numpy(batch.dense), torch.from_numpy(batch.label), len(batch)
        parts = _split(batch.sparse, len(self.servers) if self.rpc else 1)
        if self.sync == "async":
            pulled_dense = self.rpc.rpc_async(self.servers[0], _pull_dense)
        leaves = [rows.requires_grad_() for rows in self._rows(parts, train=True)]
        if self.sync == "async":
            with torch.no_grad():
                for param, value in zip(self.tower.parameters(), pulled_dense.wait()):
                    param.copy_(value)
        embedded, wide = _assemble(parts, [leaf[p[2]] for leaf, p in zip(leaves, parts)], n, self.dim)
        loss = F.binary_cross_entropy_with_logits(self.model(dense, embedded, wide), labels)
        self.tower.zero_grad()
        loss.backward()  # sync: DDP all-reduces the tower's gradients over the trainers here
        pushed = batch.sparse.size
        if self.sync == "async":
            self.pending = [
                self.rpc.rpc_async(self.servers[0], _push_dense, args=([p.grad for p in self.tower.parameters()],)),
                *(
                    self.rpc.rpc_async(s, _push, args=(p[1], leaf.grad, p[3], pushed))
                    for s, p, leaf in zip(self.servers, parts, leaves)
                ),
            ]
            return float(loss.detach())
        self.optimizer.step()
        if self.rpc is None:
            self.table.push(parts[0][1].numpy(), leaves[0].grad.numpy(), parts[0][3].numpy(), pushed)
            return float(loss.detach())
        for f in [
            self.rpc.rpc_async(s, _push_when_all_arrived, args=(p[1], leaf.grad, p[3], pushed, self.role.index))
            for s, p, leaf in zip(self.servers, parts, leaves)
        ]:
            f.wait()
        return float(loss.detach())

    def _check_pushes(self) -> None:
        """Async: the last step's pushes were sent without waiting; a failed one is raised here."""
        for f in self.pending:
            f.wait()
        self.pending = []

    def predict(self, batch: CtrData) -> np.ndarray:
        dense, n = torch.from_numpy(batch.dense), len(batch)
        parts = _split(batch.sparse, len(self.servers) if self.rpc else 1)
        with torch.no_grad():
            rows = [r[p[2]] for r, p in zip(self._rows(parts, train=False), parts)]
            embedded, wide = _assemble(parts, rows, n, self.dim)
            return torch.sigmoid(self.tower(dense, embedded, wide)).numpy()

    def barrier(self) -> None:
        if self.rpc is not None:
            self._check_pushes()
            tdist.barrier(group=self.trainer_group)

    def save_state(self, folder: Path) -> None:
        if self.rpc is None:
            np.savez(folder / TABLE_FILE.format(0), **self.table.arrays())
            _save_dense(folder, self.tower, self.optimizer)
            return
        for server in self.servers:
            self.rpc.rpc_sync(server, _save, args=(str(folder),))
        if self.sync == "sync":
            _save_dense(folder, self.tower, self.optimizer)

    def end_training(self) -> None:
        if self.rpc is None:
            return
        self.barrier()
        if self.sync == "async":
            # Evaluate the servers' final tower, not this trainer's copy from before its last push.
            with torch.no_grad():
                for param, value in zip(self.tower.parameters(), self.rpc.rpc_sync(self.servers[0], _pull_dense)):
                    param.copy_(value)

    def observed(self) -> Dict[str, Any]:
        if self.rpc is None:
            return {
                "engine": "none (one process)",
                "sync": "local",
                "sparse_rule": self.cfg.optim.name,
                "tables": {"rows": self.table.rows, "bytes": self.table.nbytes},
            }
        stats = [self.rpc.rpc_sync(s, _stats) for s in self.servers]

        def total(key: str) -> int:
            return sum(t[key] for t in stats)

        # Counted on the servers: rows sent to trainers, rows of gradient received, updates
        # applied (sync: each held every trainer's gradients), the rows their tables created.
        return {
            "engine": f"torch.distributed.rpc (TensorPipe), torch {torch.__version__}",
            "sync": self.sync,
            "sparse_rule": self.cfg.optim.name,
            "dense": "DistributedDataParallel over the trainers" if self.sync == "sync" else "on server 0",
            "tables": {"rows": total("table_rows"), "bytes": total("table_bytes")},
            "traffic": {
                "rows_pulled": total("rows_pulled"),
                "rows_pushed": total("rows_pushed"),
                ("synchronous_updates" if self.sync == "sync" else "sparse_updates"): total("updates"),
                **({"dense_updates": total("dense_updates")} if self.sync == "async" else {}),
            },
        }

    def close(self) -> None:
        if self.rpc is not None:
            self.rpc.shutdown()
            self.rpc = None
        if tdist.is_initialized():
            tdist.destroy_process_group()


def build(cfg, role: Role, resume: Optional[Path]) -> TorchPs:
    return TorchPs(cfg, role, resume)
