"""torchrun (torch.distributed.run), as unitrain invokes it (this module does not import torch)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Mapping, Optional

from unitrain.config.schema import DistConfig
from unitrain.errors import UnitrainError
from unitrain.host.network import NodeNetwork
from unitrain.host.ports import free_port
from unitrain.interface.launch import GLOO_PEER_LOSS, Launcher, busy_port_error, not_joined_error
from unitrain.interface.ps import PsLayout, Role

__all__ = ["ACCELERATOR_PROBE", "LAUNCHER", "ps_role"]

ACCELERATOR_PROBE = "import torch; print(torch.cuda.is_available())"


class _TorchLauncher(Launcher):
    module, writes_workerlogs = "torch.distributed.run", False
    rank_env, local_rank_env = "RANK", "LOCAL_RANK"
    times_out_rendezvous = True

    peer_loss_markers = (
        *GLOO_PEER_LOSS,
        # TensorPipe (torch.distributed.rpc): any transport error (EPIPE, EOF).
        "tensorpipe/transport/",
    )

    def options(self, dist: DistConfig, run_dir: Path) -> List[str]:
        return _torchrun_options(dist, dist.nproc_per_node)

    def ps_options(self, dist: DistConfig, run_dir: Path) -> List[str]:
        # Servers and trainers are all torchrun's workers, a node's servers first. Nodes may run
        # different counts: torchrun numbers the ranks node after node. (dist.max_restarts is
        # refused in this mode: 0.)
        return _torchrun_options(dist, PsLayout.of(dist.ps, dist.nnodes).processes(dist.node_rank))

    def network_env(self, network: NodeNetwork) -> Dict[str, str]:
        # TensorPipe (torch.distributed.rpc) picks its address apart from gloo.
        return {**super().network_env(network), "TP_SOCKET_IFNAME": network.interface}

    def known_failure(
        self, dist: DistConfig, launcher_log: str, worker_logs: List[str], started: bool
    ) -> Optional[UnitrainError]:
        if started:
            return None
        if "EADDRINUSE" in launcher_log:
            return busy_port_error(dist.master_port) if dist.master_port else None
        waiting = "waiting for clients" in launcher_log or "client socket has timed out" in launcher_log
        if dist.nnodes > 1 and waiting:
            return not_joined_error(dist)
        return None


def _torchrun_options(dist: DistConfig, processes: int) -> List[str]:
    """torchrun's options for ``processes`` workers on this node."""
    # A fresh port per job: sweeps run jobs back to back, and a port in TIME_WAIT would clash.
    port = dist.master_port or free_port()
    opts = ["--nproc_per_node", str(processes), "--nnodes", str(dist.nnodes)]
    opts += ["--node_rank", str(dist.node_rank), "--master_addr", dist.master_addr]
    # --max_restarts: torchrun restarts this node's workers after one fails (its static
    # rendezvous keeps one store for every attempt: the workers prefix their keys).
    opts += ["--master_port", str(port), "--max_restarts", str(dist.max_restarts)]
    if dist.nnodes > 1:
        # The static rendezvous (a TCPStore on node 0) waits this long for the other nodes,
        # node 0 for clients, the others to connect; it takes whole seconds (default 600).
        opts += ["--rdzv-conf", f"timeout={math.ceil(dist.timeout_s)}"]
    return opts


LAUNCHER = _TorchLauncher()


def ps_role(env: Mapping[str, str], layout: PsLayout) -> Role:
    """torchrun gives each node's processes LOCAL_RANK and the node GROUP_RANK: a node's first
    ranks serve."""
    return layout.role(int(env.get("GROUP_RANK", "0")), int(env.get("LOCAL_RANK", "0")))
