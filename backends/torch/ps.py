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
config refuses it. The pieces are in ``ps_rpc/``: the model (``model.py``) and its checkpoint
files (``checkpoint.py``), a server's state and the RPC handlers (``server.py``), a trainer's
batch split over the servers (``batches.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import torch
import torch.distributed as tdist
import torch.nn.functional as F

from unitrain.backends.torch.ps_rpc import server
from unitrain.backends.torch.ps_rpc.batches import Stream, assemble, split
from unitrain.backends.torch.ps_rpc.checkpoint import TABLE_FILE, load_dense, load_tables, save_dense
from unitrain.backends.torch.ps_rpc.model import Tower, dense_optimizer, new_table
from unitrain.data.criteo import CtrData
from unitrain.data.criteo_files import Share
from unitrain.errors import Refusal
from unitrain.interface.ps import PsProgram, Role

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


class TorchPs(PsProgram):
    def __init__(self, cfg, role: Role, resume: Optional[Path]):
        self.cfg, self.role, self.dim = cfg, role, cfg.model.embedding_dim
        self.sync = "local" if role.servers == 0 else cfg.dist.ps.sync
        self.rpc = None
        self.pending: List[Any] = []
        if role.servers == 0:
            self.table = new_table(cfg)
            self.tower = Tower(cfg)
            self.model = self.tower
            self.optimizer = dense_optimizer(cfg.optim.name, self.tower.parameters(), cfg.optim.lr)
            if resume is not None:
                load_tables(self.table, resume, 0, 1)
                load_dense(resume, self.tower, self.optimizer)
            return
        from torch.distributed import rpc

        self.rpc = rpc
        world = role.servers + role.trainers
        # Every process joins the default group (new_group must be called by all of them); the
        # trainers' own group carries the sync mode's all-reduce and the final barrier.
        tdist.init_process_group("gloo", init_method="env://", rank=role.rank, world_size=world)
        self.trainer_group = tdist.new_group(list(range(role.servers, world)))
        if role.kind == "server":
            server.start(cfg, role, resume)
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
            self.optimizer = dense_optimizer(cfg.optim.name, self.model.parameters(), cfg.optim.lr)
            if resume is not None:
                load_dense(resume, self.tower, self.optimizer)
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
        loader = torch.utils.data.DataLoader(Stream(share, batch_size, skip), batch_size=None, num_workers=workers)
        for item in loader:
            if isinstance(item, str):
                raise Refusal(item)
            yield CtrData(*(t.numpy() for t in item))

    def _rows(self, parts, train: bool) -> List[torch.Tensor]:
        """Each part's unique rows, from this process's table or its server."""
        if self.rpc is None:
            get = self.table.pull if train else self.table.peek
            return [torch.from_numpy(get(unique.numpy())) for _, unique, _, _ in parts]
        handler = server.pull if train else server.peek
        futures = [self.rpc.rpc_async(s, handler, args=(unique,)) for s, (_, unique, _, _) in zip(self.servers, parts)]
        return [f.wait() for f in futures]

    def train_batch(self, batch: CtrData) -> float:
        self._check_pushes()
        dense, labels, n = torch.from_numpy(batch.dense), torch.from_numpy(batch.label), len(batch)
        parts = split(batch.sparse, len(self.servers) if self.rpc else 1)
        if self.sync == "async":
            pulled_dense = self.rpc.rpc_async(self.servers[0], server.pull_dense)
        leaves = [rows.requires_grad_() for rows in self._rows(parts, train=True)]
        if self.sync == "async":
            with torch.no_grad():
                for param, value in zip(self.tower.parameters(), pulled_dense.wait()):
                    param.copy_(value)
        embedded, wide = assemble(parts, [leaf[p[2]] for leaf, p in zip(leaves, parts)], n, self.dim)
        loss = F.binary_cross_entropy_with_logits(self.model(dense, embedded, wide), labels)
        self.tower.zero_grad()
        loss.backward()  # sync: DDP all-reduces the tower's gradients over the trainers here
        pushed = batch.sparse.size
        if self.sync == "async":
            self.pending = [
                self.rpc.rpc_async(
                    self.servers[0], server.push_dense, args=([p.grad for p in self.tower.parameters()],)
                ),
                *(
                    self.rpc.rpc_async(s, server.push, args=(p[1], leaf.grad, p[3], pushed))
                    for s, p, leaf in zip(self.servers, parts, leaves)
                ),
            ]
            return float(loss.detach())
        self.optimizer.step()
        if self.rpc is None:
            self.table.push(parts[0][1].numpy(), leaves[0].grad.numpy(), parts[0][3].numpy(), pushed)
            return float(loss.detach())
        for f in [
            self.rpc.rpc_async(s, server.push_when_all_arrived, args=(p[1], leaf.grad, p[3], pushed, self.role.index))
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
        parts = split(batch.sparse, len(self.servers) if self.rpc else 1)
        with torch.no_grad():
            rows = [r[p[2]] for r, p in zip(self._rows(parts, train=False), parts)]
            embedded, wide = assemble(parts, rows, n, self.dim)
            return torch.sigmoid(self.tower(dense, embedded, wide)).numpy()

    def barrier(self) -> None:
        if self.rpc is not None:
            self._check_pushes()
            tdist.barrier(group=self.trainer_group)

    def save_state(self, folder: Path) -> None:
        if self.rpc is None:
            np.savez(folder / TABLE_FILE.format(0), **self.table.arrays())
            save_dense(folder, self.tower, self.optimizer)
            return
        for name in self.servers:
            self.rpc.rpc_sync(name, server.save, args=(str(folder),))
        if self.sync == "sync":
            save_dense(folder, self.tower, self.optimizer)

    def end_training(self) -> None:
        if self.rpc is None:
            return
        self.barrier()
        if self.sync == "async":
            # Evaluate the servers' final tower, not this trainer's copy from before its last push.
            with torch.no_grad():
                for param, value in zip(self.tower.parameters(), self.rpc.rpc_sync(self.servers[0], server.pull_dense)):
                    param.copy_(value)

    def observed(self) -> Dict[str, Any]:
        if self.rpc is None:
            return {
                "engine": "none (one process)",
                "sync": "local",
                "sparse_rule": self.cfg.optim.name,
                "tables": {"rows": self.table.rows, "bytes": self.table.nbytes},
            }
        stats = [self.rpc.rpc_sync(s, server.stats) for s in self.servers]

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
