"""The frameworks' own launchers (paddle.distributed.launch, torchrun): what
``backends/<name>/launch.py`` provides, without importing its framework.

A launcher is described here, not run: :mod:`unitrain.launch.supervise` starts it with
unitrain's worker script, watches it and ends it; the backend says how its launcher is invoked,
which variables give each worker its rank, and which of its failures it can name in one line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Protocol, Tuple, cast

from unitrain.config.schema import DistConfig
from unitrain.errors import ConfigError, UnitrainError
from unitrain.host.network import NodeNetwork
from unitrain.interface import modules
from unitrain.interface.ps import PsLayout, Role

#: What gloo, the collective library both frameworks' CPU builds use, writes when a peer goes away
#: (any pair error, timeouts included, is about the peer): for the backends' peer_loss_markers.
GLOO_PEER_LOSS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "IoException",
    "transport/tcp/pair.cc",
)


@dataclass(frozen=True, kw_only=True)
class Beside:
    """What a launcher needs running beside it for a job: more of its options and variables."""

    options: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    #: Run as ``python -m <module>`` instead of the launcher's own: the same launcher with a fix.
    module: Optional[str] = None


class Launcher(ABC):
    #: Run as ``python -m <module>``.
    module: str
    #: The variables in which the launcher gives each worker its global rank and its rank on the node.
    rank_env: str
    local_rank_env: str
    #: Whether the launcher itself writes <run_dir>/workerlog.<rank>.
    writes_workerlogs: bool
    #: Whether the launcher gives up on a rendezvous after dist.timeout_s by itself.
    times_out_rendezvous: bool
    #: Variables the framework needs set before it loads, in parameter-server mode.
    ps_env: Mapping[str, str] = {}
    #: What the framework's collective and RPC libraries write when a peer process disappears:
    #: a process whose log or error holds one died of another's death, not of its own.
    peer_loss_markers: Tuple[str, ...] = ()

    def remove_stale(self) -> None:
        """Remove what jobs of this launcher that no longer run left on this machine (a job killed
        outright cannot clean up after itself), saying so in one line; nothing by default."""

    @abstractmethod
    def options(self, dist: DistConfig, run_dir: Path) -> List[str]:
        """The launcher's options for a data-parallel job."""

    @abstractmethod
    def ps_options(self, dist: DistConfig, run_dir: Path) -> List[str]:
        """The launcher's options for this node's servers and trainers (:class:`PsLayout`)."""

    @contextmanager
    def beside(self, dist: DistConfig, run_dir: Path) -> Iterator[Beside]:
        """Start what the launcher needs beside it for this job (Paddle's restarts: an etcd
        server), and stop it when the block ends."""
        yield Beside()

    def network_env(self, network: NodeNetwork) -> Dict[str, str]:
        """Variables that make the launcher and its workers talk on ``network`` (several nodes):
        gloo binds to what the host name resolves to unless told an interface."""
        return {"GLOO_SOCKET_IFNAME": network.interface}

    def known_failure(
        self, dist: DistConfig, launcher_log: str, worker_logs: List[str], started: bool
    ) -> Optional[UnitrainError]:
        """A failure of the launcher's own (rendezvous, port) said in one line, or None. ``started``:
        whether any worker reported (the launcher's rendezvous comes before its first worker)."""
        return None


class LaunchModule(Protocol):
    LAUNCHER: Launcher
    #: Python code that prints True when the framework sees an accelerator (run in a child
    #: process: the main process never imports a framework).
    ACCELERATOR_PROBE: str

    def ps_role(self, env: Mapping[str, str], layout: PsLayout) -> Role:
        """This process's role in a parameter-server job, from the variables the launcher set."""


def busy_port_error(port: int, why: str = "address already in use") -> ConfigError:
    return ConfigError(
        "dist.master_port",
        port,
        f"it is in use on this machine ({why}); pick a free port, or leave it unset on one node",
    )


def not_joined_error(dist: DistConfig) -> UnitrainError:
    return UnitrainError(
        f"dist.nnodes={dist.nnodes}: the other node(s) did not join at {dist.master_addr}:{dist.master_port} "
        f"within dist.timeout_s={dist.timeout_s:g}s; start the same command on every node "
        f"(dist.node_rank=0..{dist.nnodes - 1})"
    )


def launch_module(backend: str) -> LaunchModule:
    return cast(LaunchModule, modules.load(backend, "launch"))
