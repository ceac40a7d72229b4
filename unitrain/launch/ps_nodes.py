"""A parameter-server job over several nodes, as one node's main process sees it.

Paddle's launcher has no rendezvous in parameter-server mode and its servers wait for nobody,
and both engines' servers wait without limit for trainers that are gone. So each node keeps
its own clock: its processes say when their engine reached the others (``connected``), and a
node whose processes hold no connection to another host for ``dist.timeout_s`` has lost the
others.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List

from unitrain.errors import UnitrainError
from unitrain.host.network import remote_peers
from unitrain.interface.ps import PsLayout
from unitrain.launch.workers import worker_statuses

#: Seconds between looks at the processes' connections (a few /proc reads).
LOOK_EVERY_S = 1.0


class PsNodeWatch:
    def __init__(self, cfg: Any, run_dir: Path):
        self.dist = cfg.dist
        self.run_dir = run_dir
        self.layout = PsLayout.of(cfg.dist.ps, cfg.dist.nnodes)
        self.last_peer = time.monotonic()
        self.last_look = 0.0

    def _connected(self) -> List[Dict[str, Any]]:
        return [s for s in worker_statuses(self.run_dir) if s.get("connected") and s.get("status") == "running"]

    def joined(self) -> bool:
        """Every process of this node reached the others; on a node of servers only, a process
        of another node has reached one of them (Paddle's servers do not wait for trainers)."""
        connected = self._connected()
        if len(connected) < self.layout.processes(self.dist.node_rank):
            return False
        if self.layout.trainers[self.dist.node_rank]:
            return True
        return bool(remote_peers(s["pid"] for s in connected))

    def check(self) -> None:
        """Raise once this node's processes have held no connection to another host for
        dist.timeout_s (call after :meth:`joined`)."""
        now = time.monotonic()
        if now - self.last_look < LOOK_EVERY_S:
            return
        self.last_look = now
        running = self._connected()
        if not running or remote_peers(s["pid"] for s in running):
            self.last_peer = now
        elif now - self.last_peer > self.dist.timeout_s:
            raise UnitrainError(
                f"dist.nnodes={self.dist.nnodes}: node {self.dist.node_rank}'s parameter-server processes have had "
                f"no connection to another node for dist.timeout_s={self.dist.timeout_s:g}s mid-run (the other "
                "node(s) stopped, or the network between them went away: their run directories say which)"
            )
