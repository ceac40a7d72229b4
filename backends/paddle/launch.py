"""paddle.distributed.launch, as unitrain invokes it, and the etcd server its elastic mode needs
beside it for restarts (this module does not import paddle)."""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

from unitrain.config.schema import DistConfig
from unitrain.errors import UnitrainError
from unitrain.host import processes
from unitrain.host.network import NodeNetwork
from unitrain.host.ports import free_port, quiet_range
from unitrain.interface.launch import GLOO_PEER_LOSS, Beside, Launcher, busy_port_error, not_joined_error
from unitrain.interface.ps import PsLayout, Role

__all__ = ["ACCELERATOR_PROBE", "LAUNCHER", "ps_role"]

log = logging.getLogger("unitrain")

ACCELERATOR_PROBE = "import paddle; print(paddle.device.cuda.device_count() > 0)"


class _PaddleLauncher(Launcher):
    # Every launch runs it through unitrain's shim (elastic_launch), which writes none of the
    # environment into its log directory (--log_dir: as it ships, envlog.N, backup_env.N.json and
    # its pod log hold every worker's whole environment, and tokens live there). That directory
    # is still a private one outside the run (beside()), named after the main process, so that
    # the next launch removes one a killed job left; each worker writes its own workerlog.N.
    module, writes_workerlogs = "paddle.distributed.launch", False
    rank_env, local_rank_env = "PADDLE_TRAINER_ID", "PADDLE_LOCAL_RANK"
    # Its HTTP master waits for the other nodes with no time limit (--elastic_timeout only
    # applies to etcd:// masters): the main process keeps the clock.
    times_out_rendezvous = False
    # Parameter-server mode is static graph only, and Paddle's sparse tables fail under PIR.
    ps_env = {"FLAGS_enable_pir_api": "0"}

    peer_loss_markers = (
        *GLOO_PEER_LOSS,
        # brpc (Fleet's parameter-server client): a server not connected, refusing, or resetting.
        "]Not connected to",
        "[E111]",
        "[E104]",
    )

    def options(self, dist: DistConfig, run_dir: Path) -> List[str]:
        # --max_restart 0: a failed worker ends the job (paddle's default restarts it 3 times).
        opts = ["--nproc_per_node", str(dist.nproc_per_node), "--nnodes", str(dist.nnodes)]
        opts += ["--max_restart", "0"]
        if dist.max_restarts:
            # Its elastic controller deploys the pod while restarts <= --max_restart, counting
            # from the first deploy: N - 1 gives N restarts. The master is etcd's (beside).
            opts[-1] = str(dist.max_restarts - 1)
            # Several nodes: the etcd master orders the pods by their --rank, so that each node
            # keeps its ranks across restarts.
            return opts + (["--rank", str(dist.node_rank)] if dist.nnodes > 1 else [])
        if dist.nnodes > 1:
            opts += ["--master", f"{dist.master_addr}:{dist.master_port}", "--rank", str(dist.node_rank)]
        elif dist.master_port is not None:
            # On one node --master is never contacted and the workers' store takes a random
            # port; with --ips and --start_port the store (PADDLE_MASTER) is <ips>:<start_port>.
            opts += ["--ips", dist.master_addr, "--start_port", str(dist.master_port)]
        return opts

    def remove_stale(self) -> None:
        _remove_stale_folders()

    @contextmanager
    def beside(self, dist: DistConfig, run_dir: Path) -> Iterator[Beside]:
        _remove_stale_folders()
        ports = _port_range()
        with _private_log_dir(run_dir) as log_dir:
            if not dist.max_restarts:
                yield Beside(options=["--log_dir", log_dir], env=ports, module=SHIM)
                return
            with self._elastic(dist, run_dir) as elastic:
                options = ["--log_dir", log_dir, *elastic.options]
                yield Beside(options=options, env={**ports, **elastic.env}, module=SHIM)

    @contextmanager
    def _elastic(self, dist: DistConfig, run_dir: Path) -> Iterator[Beside]:
        # Only CollectiveElasticController, chosen by an etcd:// master, restarts a failed pod
        # (elastic level 1: restart it; the default ends the job). Its etcd3 client's generated
        # code predates protobuf 4 and loads only on protobuf's pure-Python implementation. The
        # client runs gRPC in the launcher, which then forks and execs the workers: gRPC's fork
        # handlers, meant for fork without exec, broke a restarted worker between the two
        # (epoll_wait: Bad file descriptor, then it ended); gRPC's own switch turns them off.
        env = {"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python", "GRPC_ENABLE_FORK_SUPPORT": "false"}
        with _etcd_for(dist, run_dir / "etcd.log") as endpoint:
            # Every node's launcher names the same job (one etcd per job: the port is the job's).
            job = f"unitrain-{dist.master_port}" if dist.nnodes > 1 else f"unitrain-{os.getpid()}"
            options = ["--master", f"etcd://{endpoint}", "--elastic_level", "1", "--job_id", job]
            # Before each (re)start it waits for every node's pod ten times --elastic_timeout
            # (the default: 300 s), then ends the job: a lost node is given dist.timeout_s.
            options += ["--elastic_timeout", str(max(1, math.ceil(dist.timeout_s / 10)))]
            # Its race between a failed pod's restart and its wait for the others is closed in
            # the shim every launch runs through.
            yield Beside(options=options, env=env)

    def network_env(self, network: NodeNetwork) -> Dict[str, str]:
        # POD_IP is --host: the address this node registers with the master, which otherwise
        # is what the host name resolves to (often 127.0.0.1, unreachable from the others).
        return {**super().network_env(network), "POD_IP": network.address}

    def ps_options(self, dist: DistConfig, run_dir: Path) -> List[str]:
        # --server_num/--trainer_num select the parameter-server controller (--worker_num would
        # silently fall back to the legacy launcher); its processes write serverlog.N and workerlog.N.
        opts = ["--max_restart", "0"]
        if dist.nnodes == 1:
            return ["--server_num", str(dist.ps.servers), "--trainer_num", str(dist.ps.trainers), *opts]
        # Several nodes: every endpoint, given alike to each node's launcher, which starts those
        # on its own address (its --master mode would start at least one server on every node).
        servers, trainers = ps_endpoints(dist)
        opts += ["--servers", ",".join(servers), "--trainers", ",".join(trainers)]
        opts += ["--host", dist.ps.hosts[dist.node_rank]]
        # The servers' gloo key-value store, on the first server's host.
        return opts + ["--gloo_port", str(dist.master_port)]

    def known_failure(
        self, dist: DistConfig, launcher_log: str, worker_logs: List[str], started: bool
    ) -> Optional[UnitrainError]:
        # Rank 0 creates the store on the master port; a busy one aborts it in libuv.
        if dist.node_rank == 0 and worker_logs and "TCPServer::create" in worker_logs[0]:
            if dist.master_port:
                return busy_port_error(dist.master_port)
            return UnitrainError(
                "paddle's workers could not listen on the port paddle.distributed.launch chose; "
                "set a free dist.master_port"
            )
        return None


LAUNCHER = _PaddleLauncher()

#: paddle.distributed.launch as every unitrain job runs it: no environment written to disk, and
#: its elastic restart's race closed.
SHIM = f"{__package__}.elastic_launch"


def ps_endpoints(dist: DistConfig) -> Tuple[List[str], List[str]]:
    """Every server's and trainer's address:port, node after node: a node's processes take the
    ports after dist.master_port, its servers first."""
    layout = PsLayout.of(dist.ps, dist.nnodes)
    servers: List[str] = []
    trainers: List[str] = []
    for node, host in enumerate(dist.ps.hosts):
        ports = iter(range(dist.master_port + 1, dist.master_port + 1 + layout.processes(node)))
        servers += [f"{host}:{next(ports)}" for _ in range(layout.servers[node])]
        trainers += [f"{host}:{next(ports)}" for _ in range(layout.trainers[node])]
    return servers, trainers


def ps_role(env: Mapping[str, str], layout: PsLayout) -> Role:
    """paddle.distributed.launch sets TRAINING_ROLE, and for a server its endpoint, whose place in
    the server list is its index; for a trainer PADDLE_TRAINER_ID."""
    servers, trainers = layout.total_servers, layout.total_trainers
    if env.get("TRAINING_ROLE") == "PSERVER":
        endpoint = f"{env.get('POD_IP', '127.0.0.1')}:{env.get('PADDLE_PORT', '')}"
        endpoints = env.get("PADDLE_PSERVERS_IP_PORT_LIST", "").split(",")
        return Role("server", endpoints.index(endpoint) if endpoint in endpoints else 0, servers, trainers)
    return Role("trainer", int(env.get("PADDLE_TRAINER_ID", "0")), servers, trainers)


# --- The temporary folders a job keeps beside its launcher (its --log_dir, etcd's data), each
# named after the main process that made it: unitrain-<what>-<pid>-<start time>-<random>. A job
# killed outright (SIGKILL) cannot remove its own; the next launch on the machine removes those
# whose process is gone (its pid no longer runs, or runs a later process: the start time differs).
LAUNCH_DIR, ETCD_DIR = "unitrain-paddle-launch-", "unitrain-etcd-"
_OWNED = re.compile(rf"^(?:{re.escape(LAUNCH_DIR)}|{re.escape(ETCD_DIR)})(\d+)-(\d+)-[^-]+$")


def _owned_prefix(what: str) -> str:
    """The prefix of this process's folders: ``<what><pid>-<start time>-``."""
    pid = os.getpid()
    return f"{what}{pid}-{processes.start_time(pid)}-"


def _remove_stale_folders() -> None:
    """Remove the folders of jobs whose main process is gone, saying so in one line. A folder
    named otherwise (an older unitrain's, with no pid) is left alone: whether its job still runs
    cannot be told."""
    root = Path(tempfile.gettempdir())
    try:
        candidates = [p for p in root.iterdir() if _OWNED.match(p.name)]
    except OSError:
        return
    removed = []
    for folder in sorted(candidates):
        pid, started = _OWNED.match(folder.name).groups()
        if processes.start_time(int(pid)) == started or not folder.is_dir() or folder.is_symlink():
            continue
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            removed.append(folder.name)
    if removed:
        log.info(
            "removed %d folder(s) left in %s by Paddle jobs that no longer run: %s",
            len(removed),
            root,
            ", ".join(removed),
        )


@contextmanager
def _private_log_dir(run_dir: Path) -> Iterator[str]:
    """A directory only this user can read, for the launcher's logs, removed when the job ends.
    A worker that died before it could open its own log left its output only there: that log
    is kept in the run directory."""
    with tempfile.TemporaryDirectory(prefix=_owned_prefix(LAUNCH_DIR)) as private:
        try:
            yield private
        finally:
            for log in Path(private).glob("*log.*"):
                if log.name.startswith(("workerlog.", "serverlog.")) and not (run_dir / log.name).exists():
                    shutil.copyfile(log, run_dir / log.name)


# --- etcd: the key-value store whose leases the launcher's elastic mode (--master etcd://...)
# keeps its pods' state in; Debian's etcd-server, one fresh server per job.
#: Seconds etcd may take to answer on its client port.
ETCD_READY_S = 30.0


def _port_range() -> Dict[str, str]:
    """Where the launcher takes the ports it picks for the servers, the trainers' gloo store and
    the workers' master: its default (35100-64000) overlaps the range every outgoing connection
    takes a port from, and a parameter server whose port was taken that way between the
    launcher's check and its own bind never listens."""
    quiet = quiet_range()
    return {"PORT_RANGE": f"{quiet[0]}:{quiet[1]}"} if quiet else {}


def _listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


@contextmanager
def _etcd_for(dist: DistConfig, log_file: Path) -> Iterator[str]:
    """The job's etcd endpoint: on one node a fresh server on free local ports; over several,
    node 0's on dist.master_addr:dist.master_port, which the other nodes wait for (up to
    dist.timeout_s: their launchers' client fails at once on a port nobody listens on)."""
    if dist.nnodes == 1:
        with _etcd_server(log_file, "127.0.0.1", free_port()) as endpoint:
            yield endpoint
        return
    if dist.node_rank == 0:
        with _etcd_server(log_file, dist.master_addr, dist.master_port) as endpoint:
            yield endpoint
        return
    deadline = time.monotonic() + dist.timeout_s
    while not _listening(dist.master_addr, dist.master_port):
        if time.monotonic() > deadline:
            raise not_joined_error(dist)
        time.sleep(0.5)
    yield f"{dist.master_addr}:{dist.master_port}"


@contextmanager
def _etcd_server(log_file: Path, host: str, client: int) -> Iterator[str]:
    """A fresh etcd whose clients reach it at ``host:client``, its output in ``log_file``;
    yields that endpoint and stops it, however the block ends (it also dies with this process).
    Its data (a 64 MB write-ahead log however little is kept) lives in a temporary directory,
    removed after."""
    binary = shutil.which("etcd")
    if binary is None:
        raise UnitrainError(
            "no etcd on this machine: paddle.distributed.launch restarts workers only with an etcd server "
            "(`make etcd` installs Debian's etcd-server)"
        )
    with tempfile.TemporaryDirectory(prefix=_owned_prefix(ETCD_DIR)) as data_dir:
        with _etcd_running(binary, Path(data_dir), log_file, host, client) as endpoint:
            yield endpoint


@contextmanager
def _etcd_running(binary: str, data_dir: Path, log_file: Path, host: str, client: int) -> Iterator[str]:
    # Its peer port stays local: the job's etcd is one member.
    peer = free_port()
    command = [
        binary,
        "--name=unitrain",
        f"--data-dir={data_dir}",
        f"--listen-client-urls=http://{host}:{client}",
        f"--advertise-client-urls=http://{host}:{client}",
        f"--listen-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-cluster=unitrain=http://127.0.0.1:{peer}",
    ]
    with open(log_file, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=processes.die_with_parent)
    try:
        deadline = time.monotonic() + ETCD_READY_S
        while not _listening(host, client):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise UnitrainError(f"etcd did not start (see {log_file})")
            time.sleep(0.1)
        yield f"{host}:{client}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
