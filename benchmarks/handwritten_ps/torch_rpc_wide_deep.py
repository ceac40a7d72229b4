"""Wide&deep on a parameter server built with torch.distributed.rpc, written as a PyTorch user
writes it from the RPC parameter-server tutorial and its batch-updating example: one process
holds the parameters (both embedding tables and the dense tower) behind an RRef; trainers pull
the rows their batch needs, compute, and push gradients, which the server applies with Adam
as they arrive (async). It shares nothing with unitrain but the data files.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/handwritten_ps/torch_rpc_wide_deep.py --data DIR/train

It starts 1 server + --trainers trainers with torch.multiprocessing. DIR/train holds Criteo TSV
part files (label, I1..I13, C1..C26); trainer i of T reads the files i, i+T, ... Each trainer
prints (and appends to --out) one JSON line: examples, the seconds of its training loop,
examples/s over the loop, and the median examples/s of its steps.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time
from pathlib import Path
from typing import List, Optional, Tuple

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from criteo_rows import DENSE, SLOTS, Batch, batches, dense_stats  # beside this script
from torch.distributed import rpc
from trainer_result import report, trainer_result

SERVER = "ps"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="folder of Criteo TSV part files")
    p.add_argument("--trainers", type=int, default=2)
    p.add_argument("--batch", type=int, default=512, help="rows per step per trainer")
    p.add_argument("--lr", type=float, default=0.001, help="Adam's, dense and sparse")
    p.add_argument("--buckets", type=int, default=100_000, help="hash buckets of the categorical ids")
    p.add_argument("--dim", type=int, default=8, help="embedding width")
    p.add_argument("--hidden", default="400,400,400", help="the deep tower's layers")
    p.add_argument("--out", help="a file each trainer appends its JSON line to")
    return p.parse_args()


# --- model ---------------------------------------------------------------------------------
class Tower(nn.Module):
    """The dense part: the deep tower over [dense features, embeddings] plus a linear term on
    the dense features; the wide embeddings' sum is added to its logit."""

    def __init__(self, dim: int, hidden: List[int]):
        super().__init__()
        widths = [DENSE + SLOTS * dim, *hidden, 1]
        self.deep = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.linear = nn.Linear(DENSE, 1)

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor, wide: torch.Tensor) -> torch.Tensor:
        x = torch.cat([dense, embedded], dim=1)
        for layer in self.deep[:-1]:
            x = F.relu(layer(x))
        return (self.deep[-1](x) + self.linear(dense)).squeeze(1) + wide


class ParameterServer:
    """Both embedding tables and the dense tower, each with Adam; RPC calls arrive on several
    threads, so one lock keeps an update whole."""

    def __init__(self, buckets: int, dim: int, hidden: List[int], lr: float):
        self.deep = nn.Embedding(buckets, dim, sparse=True)
        self.wide = nn.Embedding(buckets, 1, sparse=True)
        for table in (self.deep, self.wide):
            nn.init.uniform_(table.weight, -0.01, 0.01)
        self.tower = Tower(dim, hidden)
        self.sparse_optimizer = torch.optim.SparseAdam([self.deep.weight, self.wide.weight], lr=lr)
        self.dense_optimizer = torch.optim.Adam(self.tower.parameters(), lr=lr)
        self.lock = threading.Lock()

    def pull(self, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        with self.lock, torch.no_grad():
            return self.deep.weight[ids], self.wide.weight[ids]

    def dense(self) -> List[torch.Tensor]:
        with self.lock:
            # Copies: the reply is sent after the lock is released.
            return [p.detach().clone() for p in self.tower.parameters()]

    def push(self, ids: torch.Tensor, deep: torch.Tensor, wide: torch.Tensor, dense: List[torch.Tensor]):
        """Apply one trainer's gradients and answer with the updated dense tower (the batch
        example's update_and_fetch_model, without its batching: async)."""
        with self.lock:
            for table, grad in ((self.deep, deep), (self.wide, wide)):
                # The ids are torch.unique's: a valid sparse tensor, no need for invariant checks.
                table.weight.grad = torch.sparse_coo_tensor(ids[None], grad, table.weight.shape, check_invariants=False)
            for param, grad in zip(self.tower.parameters(), dense):
                param.grad = grad
            self.sparse_optimizer.step()
            self.dense_optimizer.step()
            return [p.detach().clone() for p in self.tower.parameters()]


_server: Optional[ParameterServer] = None
_server_lock = threading.Lock()


def get_parameter_server(buckets: int, dim: int, hidden: List[int], lr: float) -> ParameterServer:
    """Run on the server by each trainer's rpc.remote: the first call creates it (tutorial style)."""
    global _server
    with _server_lock:
        if _server is None:
            _server = ParameterServer(buckets, dim, hidden, lr)
        return _server


# --- roles ---------------------------------------------------------------------------------
def step(ps: rpc.RRef, tower: Tower, batch: Batch, dim: int) -> float:
    dense, ids, label = (torch.from_numpy(a) for a in batch)
    unique, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
    deep_rows, wide_rows = ps.rpc_sync().pull(unique)
    deep_rows.requires_grad_()
    wide_rows.requires_grad_()
    embedded = deep_rows[inverse].reshape(len(label), SLOTS * dim)
    wide = wide_rows[inverse].reshape(len(label), SLOTS).sum(dim=1)
    loss = F.binary_cross_entropy_with_logits(tower(dense, embedded, wide), label)
    tower.zero_grad()
    loss.backward()
    fresh = ps.rpc_sync().push(unique, deep_rows.grad, wide_rows.grad, [p.grad for p in tower.parameters()])
    load(tower, fresh)
    return float(loss.detach())


def load(tower: Tower, values: List[torch.Tensor]) -> None:
    with torch.no_grad():
        for param, value in zip(tower.parameters(), values):
            param.copy_(value)


def train(args: argparse.Namespace, index: int) -> dict:
    hidden = [int(h) for h in args.hidden.split(",")]
    ps = rpc.remote(SERVER, get_parameter_server, args=(args.buckets, args.dim, hidden, args.lr))
    tower = Tower(args.dim, hidden)
    load(tower, ps.rpc_sync().dense())
    files = sorted(str(p) for p in Path(args.data).iterdir() if p.is_file())
    mean, std = dense_stats(files, args.buckets)
    costs, losses, examples = [], [], 0
    started = time.perf_counter()
    for batch in batches(files[index :: args.trainers], args.batch, args.buckets, mean, std):
        tick = time.perf_counter()
        losses.append(step(ps, tower, batch, args.dim))
        costs.append(time.perf_counter() - tick)
        examples += len(batch[2])
    seconds = time.perf_counter() - started
    return trainer_result(
        framework=f"torch {torch.__version__}",
        trainer=index,
        batch=args.batch,
        costs=costs,
        losses=losses,
        examples=examples,
        seconds=seconds,
    )


def run(rank: int, args: argparse.Namespace) -> None:
    """Rank 0 serves; the others train. rpc.shutdown waits for every process, so the server
    answers until the last trainer is done."""
    name = SERVER if rank == 0 else f"trainer{rank - 1}"
    rpc.init_rpc(name, rank=rank, world_size=1 + args.trainers)
    if rank > 0:
        report(train(args, rank - 1), args.out)
    rpc.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    args = parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    mp.spawn(run, args=(args,), nprocs=1 + args.trainers, join=True)


if __name__ == "__main__":
    main()
