"""Parameter-server engines: what ``backends/<name>/ps.py`` provides (Paddle Fleet's parameter
server, torch.distributed.rpc). The job itself, its data and metrics, is the core's
(:mod:`unitrain.ps.job`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Optional, Protocol, Tuple, cast

import numpy as np

from unitrain.data.criteo import CtrData
from unitrain.data.criteo_files import FileRows, Share
from unitrain.interface import modules


@dataclass(frozen=True)
class Role:
    """A process of a parameter-server job: servers first, then trainers."""

    kind: str  # "server" or "trainer"
    index: int
    servers: int
    trainers: int
    #: Its index among its node's processes of its kind (the same as index on one node).
    local: Optional[int] = None

    @property
    def name(self) -> str:
        return f"{self.kind} {self.index}"

    @property
    def rank(self) -> int:
        """The job's rank of this process: servers first (torchrun's RANK differs over several
        nodes, whose ranks follow the nodes; the engines are given this one)."""
        return self.index if self.kind == "server" else self.servers + self.index

    @property
    def log_file(self) -> str:
        # Named as paddle.distributed.launch names them in parameter-server mode: by the
        # process's place on its node.
        place = self.index if self.local is None else self.local
        return f"{'serverlog' if self.kind == 'server' else 'workerlog'}.{place}"


@dataclass(frozen=True, kw_only=True)
class PsLayout:
    """Which node runs which processes: per node, how many servers and trainers. Servers are
    numbered node by node, and so are trainers (node 0's first)."""

    servers: Tuple[int, ...]
    trainers: Tuple[int, ...]

    @classmethod
    def of(cls, ps: Any, nnodes: int) -> "PsLayout":
        """dist.ps's layout: its per-node lists, or its totals spread evenly, earlier nodes first."""

        def spread(total: int) -> Tuple[int, ...]:
            return tuple(total // nnodes + (node < total % nnodes) for node in range(nnodes))

        servers = tuple(ps.node_servers) if ps.node_servers else spread(ps.servers)
        trainers = tuple(ps.node_trainers) if ps.node_trainers else spread(ps.trainers)
        return cls(servers=servers, trainers=trainers)

    @classmethod
    def parse(cls, servers: str, trainers: str) -> "PsLayout":
        """From the worker's arguments: comma-separated counts per node."""
        return cls(servers=tuple(map(int, servers.split(","))), trainers=tuple(map(int, trainers.split(","))))

    def arguments(self) -> Tuple[str, str]:
        return ",".join(map(str, self.servers)), ",".join(map(str, self.trainers))

    @property
    def total_servers(self) -> int:
        return sum(self.servers)

    @property
    def total_trainers(self) -> int:
        return sum(self.trainers)

    def server_indices(self, node: int) -> range:
        first = sum(self.servers[:node])
        return range(first, first + self.servers[node])

    def trainer_indices(self, node: int) -> range:
        first = sum(self.trainers[:node])
        return range(first, first + self.trainers[node])

    def processes(self, node: int) -> int:
        return self.servers[node] + self.trainers[node]

    def role(self, node: int, local_rank: int) -> "Role":
        """A node's processes: its servers first, then its trainers."""
        if local_rank < self.servers[node]:
            return Role("server", self.server_indices(node)[local_rank], self.total_servers, self.total_trainers)
        index = self.trainer_indices(node)[local_rank - self.servers[node]]
        return Role("trainer", index, self.total_servers, self.total_trainers)


@dataclass(frozen=True, kw_only=True)
class PassResult:
    """A pass over a trainer's files that the engine ran by itself (dist.ps.feed=engine)."""

    rows: int
    seconds: float
    loss: float  # the loss of a batch near the end of the pass (the engine's thread 0)


class PsProgram(ABC):
    """One process of a parameter-server job, as a backend builds it (``build(cfg, role)``)."""

    def run_server(self) -> None:
        """Serve parameters until the trainers are done (servers only)."""
        raise NotImplementedError

    def batches(self, share: Share, batch_size: int, workers: int, skip: int = 0) -> Iterable[CtrData]:
        """The trainer's batches in order from batch ``skip``, parsed by up to ``workers`` loader
        workers (data.num_workers); by default in the trainer's own thread."""
        return share.batches(batch_size, skip=skip)

    def train_pass(
        self, share: FileRows, batch_size: int, threads: int, progress: Callable[[float], None]
    ) -> PassResult:
        """dist.ps.feed=engine: one pass over the share's whole files, read and stepped by the
        engine in ``threads`` threads; ``progress(loss)`` is called now and then."""
        raise NotImplementedError

    @abstractmethod
    def train_batch(self, batch: CtrData) -> float:
        """One step on ``batch``: forward, backward, push gradients, pull parameters; the loss."""

    @abstractmethod
    def predict(self, batch: CtrData) -> np.ndarray:
        """Click probabilities for ``batch`` with the current parameters, without training."""

    def barrier(self) -> None:
        """Trainers only: send what this trainer still holds, then wait for the other trainers."""

    def save_state(self, folder: Path) -> None:
        """Trainer 0, while the others wait: the servers' tables (rows and their rules' state)
        and the dense tower with its optimizer, into ``folder``."""
        raise NotImplementedError

    def end_training(self) -> None:
        """After a trainer's last step: wait for the other trainers, so that what is evaluated
        next is the job's final model."""

    def observed(self) -> Dict[str, Any]:
        """What the framework reports it ran (mode, traffic), read back from it."""
        return {}

    def close(self) -> None:
        """Leave the job: stop the worker side, shut the RPC agent down."""


class PsModule(Protocol):
    def engine_problem(self) -> Optional[str]:
        """Why the installed framework cannot run a parameter-server job, or None."""

    def build(self, cfg: Any, role: Role, resume: Optional[Path]) -> PsProgram:
        """This process's part of the job (a UnitrainConfig with dist.mode=ps), its state read
        from the checkpoint ``resume`` (written by ``save_state``) before it serves or trains."""


def ps_module(backend: str) -> PsModule:
    return cast(PsModule, modules.load(backend, "ps"))
