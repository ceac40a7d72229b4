"""A trainer's side of Fleet's engine, completed where unitrain's runs need it: waiting until every
server listens, trainer 0's first push retried, gloo on a multi-node job's interface, the brpc
client's merge flags (and the steps per update they make, read back), and the Communicator of
the sync mode."""

from __future__ import annotations

import socket
import time
from typing import Any, Dict, Optional

import paddle

from unitrain.errors import UnitrainError

# Seconds a trainer waits for the servers to listen before it gives up.
SERVER_WAIT_S = 120.0
#: Tries of trainer 0's first push of the dense parameters, a second apart.
FIRST_PUSH_TRIES = 30


def wait_for_servers(endpoints) -> None:
    """init_worker pushes the initial dense parameters to the servers before it waits for them
    (and Paddle's own wait_server_ready returns at once): a server still building its program
    fails that push. Wait until every server listens."""
    deadline = time.monotonic() + SERVER_WAIT_S
    for endpoint in endpoints:
        host, port = endpoint.rsplit(":", 1)
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise UnitrainError(
                        f"parameter server {endpoint} did not start listening within {SERVER_WAIT_S:g}s; see "
                        "serverlog.*"
                    ) from None
                time.sleep(0.2)


def gloo_on_interface(interface: Optional[str]) -> None:
    """Fleet's role maker gives its gloo an empty interface, so gloo binds to what the host name
    resolves to: 127.0.x.x on many hosts (Debian's /etc/hosts), where the trainers of another
    node cannot reach it ("connect [127.0.0.1]: Connection refused"). Over several nodes
    (GLOO_SOCKET_IFNAME, set by unitrain's launch) its gloo takes that interface instead."""
    if not interface:
        return
    from paddle.base import core

    class Gloo(core.Gloo):  # type: ignore[name-defined, misc]
        def set_iface(self, iface: str) -> None:
            super().set_iface(iface or interface)

    core.Gloo = Gloo


def retry_first_push(runtime: Any) -> None:
    """Trainer 0's init_worker pushes the initial dense parameters once; a server that listens
    but has not yet set up its tables answers "push dense param failed, status[-1]" and the job
    dies (about one Paddle job in sixteen on 2 cores). The push only sets the tables' initial
    values, so it is safe to repeat: retry it for a while before giving up."""
    push = runtime._init_all_params

    def retried(*args: Any) -> Any:
        for attempt in range(FIRST_PUSH_TRIES):
            try:
                return push(*args)
            except ValueError as err:
                if "push dense param failed" not in str(err) or attempt == FIRST_PUSH_TRIES - 1:
                    raise
                time.sleep(1.0)
        return None

    runtime._init_all_params = retried


#: What Fleet's client is given when its proto names no flags (FleetWrapper::InitGFlag): naming
#: any replaces these, so they are named again.
FLEET_CLIENT_FLAGS = (
    "-max_body_size=314217728",
    "-bthread_concurrency=40",
    "-socket_max_unwritten_bytes=2048000000",
    "-max_connection_pool_size=1950",
)
MERGE_FLAG = {"sparse": "pserver_push_sparse_merge_limit", "dense": "pserver_push_dense_merge_limit"}
#: Fleet's own limits (brpc_ps_client.cc): the steps whose pushes make one update.
FLEET_MERGES = {"sparse": "about 12", "dense": 13}


def client_flags(merge: Optional[int]) -> str:
    """An async trainer's brpc client sums its queued pushes before it sends them, and each
    send is one update on the servers: PushDenseTaskConsume sends 13 steps' dense gradients at
    once (one Adam step for 13 batches), PushSparseTaskConsume about 12 steps' rows. Its limits
    are flags that are not exported (FLAGS_ variables do not reach them), only the proto's
    init_gflags. None keeps Fleet's own."""
    if merge is None:
        return ""
    # A sparse limit of 1 still waits for a second push before sending; 0 sends each.
    limits = {"sparse": 0 if merge == 1 else merge, "dense": merge - 1}
    return " ".join([*FLEET_CLIENT_FLAGS, *(f"-{MERGE_FLAG[kind]}={limit}" for kind, limit in limits.items())])


def merged_pushes(flags: str) -> Dict[str, Any]:
    """The steps per update that the flags given to Fleet's client make, read back from them."""
    given = dict(flag.lstrip("-").split("=", 1) for flag in flags.split())
    if MERGE_FLAG["dense"] not in given:
        return dict(FLEET_MERGES)
    return {"sparse": max(1, int(given[MERGE_FLAG["sparse"]])), "dense": int(given[MERGE_FLAG["dense"]]) + 1}


def sync_communicator(runtime: Any, dense: Any) -> Any:
    """Fleet's sync mode, completed. Its trainer program pushes dense gradients (which the
    servers hold back: with ``common.sync`` a dense table only collects them) and ends with
    send_barrier, which calls the process's Communicator; 3.0.0's the_one_ps creates one only
    for geo, and only its barrier table's Barrier applies the collected gradients (their
    mean, then the optimizer) once every trainer has arrived. So a SYNC Communicator is
    created here, as the_one_ps does for geo, and left stopped (a stopped one releases
    send_barrier at once; a started one waits for sends that 3.0.0 no longer routes through
    it). After each step the trainer flushes its queued pushes, meets the others at the
    barrier table, and pulls the updated dense parameters (PaddlePs._sync_step)."""
    from google.protobuf import text_format
    from paddle.distributed.communicator import Communicator
    from paddle.distributed.ps.utils.public import DistributedMode

    roles = runtime.role_maker
    kwargs = {
        "need_global_step": "0",
        "trainer_id": roles._role_id(),
        "trainers": roles._worker_num(),
        "barrier_table_id": runtime.ps_desc_builder.barrier_table_id,
        "pserver_endpoints": roles._get_pserver_endpoints(),
    }
    communicator = Communicator(DistributedMode.SYNC, kwargs, runtime.context["trainer"].get_communicator_flags())
    communicator.init_with_ctx(
        runtime._send_ctx,
        dense,
        text_format.MessageToString(runtime.ps_desc_builder.ps_desc),
        runtime.string_hosts,
        paddle.static.global_scope(),
    )
    return communicator
