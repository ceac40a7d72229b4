"""A server process of torch's parameter-server job: its state (a module global: RPC handlers are
module functions) and the handlers trainers call on it through torch.distributed.rpc: rows
pulled and peeked, row gradients pushed (applied as they arrive, or held until every trainer's
arrived), the dense tower pulled and pushed (async: it lives on server 0), saves and counters."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from unitrain.backends.torch.ps_rpc.checkpoint import TABLE_FILE, load_dense, load_tables, save_dense
from unitrain.backends.torch.ps_rpc.model import Tower, dense_optimizer, new_table
from unitrain.interface.ps import Role


class _Server:
    """A server's state; RPC handlers are module functions, so it is a module global. Server 0
    also holds the dense tower in async mode, where no trainer waits for another."""

    def __init__(self, cfg, role: Role, resume: Optional[Path]):
        self.index = role.index
        self.table = new_table(cfg)
        self.tower: Optional[Tower] = None
        if role.index == 0 and cfg.dist.ps.sync == "async":
            self.tower = Tower(cfg)
            self.tower_optimizer = dense_optimizer(cfg.optim.name, self.tower.parameters(), cfg.optim.lr)
        if resume is not None:
            load_tables(self.table, resume, role.index, role.servers)
            if self.tower is not None:
                load_dense(resume, self.tower, self.tower_optimizer)
        self.trainers = role.trainers
        self.lock = threading.Lock()
        self.pending: List[tuple] = []
        self.applied = torch.futures.Future()
        self.updates = self.dense_updates = 0
        self.rows_pushed = self.rows_pulled = 0


_SERVER: Optional[_Server] = None


def start(cfg, role: Role, resume: Optional[Path]) -> None:
    """Make this process the server ``role`` names, its state read from ``resume``."""
    global _SERVER
    _SERVER = _Server(cfg, role, resume)


def pull(ids: torch.Tensor) -> torch.Tensor:
    with _SERVER.lock:
        _SERVER.rows_pulled += len(ids)
        return torch.from_numpy(_SERVER.table.pull(ids.numpy()))


def peek(ids: torch.Tensor) -> torch.Tensor:
    """Rows for prediction: an id never trained on gets its initial row, and no row is created."""
    with _SERVER.lock:
        return torch.from_numpy(_SERVER.table.peek(ids.numpy()))


def push(ids: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, pushed: int) -> None:
    """Apply one trainer's row gradients as they arrive (async)."""
    with _SERVER.lock:
        _SERVER.rows_pushed += len(ids)
        _SERVER.table.push(ids.numpy(), grads.numpy(), counts.numpy(), pushed)
        _SERVER.updates += 1


def push_when_all_arrived(ids: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, pushed: int, trainer: int):
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


def pull_dense() -> List[torch.Tensor]:
    with _SERVER.lock:
        return [p.detach().clone() for p in _SERVER.tower.parameters()]


def push_dense(grads: List[torch.Tensor]) -> None:
    server = _SERVER
    with server.lock:
        for param, grad in zip(server.tower.parameters(), grads):
            param.grad = grad
        server.tower_optimizer.step()
        server.dense_updates += 1


def save(folder: str) -> None:
    """A server's table (and server 0's dense tower in async mode) into ``folder``."""
    server = _SERVER
    with server.lock:
        np.savez(Path(folder) / TABLE_FILE.format(server.index), **server.table.arrays())
        if server.tower is not None:
            save_dense(Path(folder), server.tower, server.tower_optimizer)


def stats() -> Dict[str, int]:
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

    global push_when_all_arrived
    push_when_all_arrived = rpc.functions.async_execution(push_when_all_arrived)


_install_async_execution()
