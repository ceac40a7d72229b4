"""paddle.distributed.launch in its elastic mode with one race closed: run as
``python -m unitrain.backends.paddle.elastic_launch <the launcher's arguments>`` (Paddle only:
torchrun's restarts have no such race).

A pod whose worker fails deletes every pod's heartbeat in etcd (``ETCDMaster.restart_peer``), so
that all of them restart, and relies on its own watch of the heartbeats to turn its status from
FAILED to RESTARTING. Its controller then waits for every pod's heartbeat (``wait_peer_ready``),
a wait that ends at once while the status is still FAILED (FAILED counts as done). When the failed
worker's processes were already gone, the controller got there before the watch's callback: it
found its peers "not ready" at once and ended the job (seen on one node, and in one of seven
restarts over two nodes here). Here the pod that deletes the heartbeats is RESTARTING at once;
the rest is Paddle's launcher as it ships.
"""

from __future__ import annotations

import runpy

from paddle.distributed.launch.controllers.master import ETCDMaster

__all__: list = []

_restart_peer = ETCDMaster.restart_peer


def _restart_peer_and_wait_for_them(self: ETCDMaster) -> None:
    _restart_peer(self)
    self.ctx.status.restart()


if __name__ == "__main__":
    ETCDMaster.restart_peer = _restart_peer_and_wait_for_them
    runpy.run_module("paddle.distributed.launch", run_name="__main__", alter_sys=True)
