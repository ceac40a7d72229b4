"""Data-parallel jobs through the frameworks' own launchers: paddle.distributed.launch, torchrun.

The main process (the Hydra job) writes the resolved config into the run directory, starts the
launcher with unitrain's worker script, shows rank 0's log as it grows, and when the launcher
ends makes sure nothing it started is left running. It imports no framework itself.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf

from unitrain.host import processes as lifeline
from unitrain.config.schema import DistConfig, UnitrainConfig
from unitrain.entry import worker
from unitrain.errors import NothingLeftToRun, UnitrainError
from unitrain.registry import Registry
from unitrain.host.threads import available_cores, resolve_threads

log = logging.getLogger("unitrain")

WORKER_SCRIPT = Path(worker.__file__).resolve()
LOG_TAIL_LINES = 20
STOP_GRACE_S = 5.0
# How often the main process looks at the launcher and its workers.
DEATH_POLL_S = 0.2
# How long past dist.timeout_s the main process waits for a launcher that times out the
# rendezvous itself (torchrun): its own start-up (imports) comes before its clock starts.
RENDEZVOUS_GRACE_S = 30.0
# What gloo writes when a peer disappears: a rank whose log ends so died of another's death.
PEER_LOSS_MARKERS = (
    "Connection reset by peer", "Connection closed by peer", "Broken pipe", "IoException",
    "transport/tcp/pair.cc",  # any gloo pair error (timeouts included) is about the peer
)  # fmt: skip


class WorkerFailedError(UnitrainError):
    """A data-parallel worker failed; the message names the rank and ends with its log's tail."""

    exit_code = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> Optional[str]:
    """Why ``port`` cannot be listened on, or None. Binds as the rendezvous stores do (every
    address, SO_REUSEADDR), so that a port another address holds counts and one in TIME_WAIT does not."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as err:
            return err.strerror or str(err)
    return None


def busy_port_error(port: int, why: str = "address already in use") -> UnitrainError:
    return UnitrainError(f"dist.master_port={port} is not allowed: it is in use on this machine ({why}); pick a free port, or leave it unset on one node")


def not_joined_error(dist: DistConfig) -> UnitrainError:
    return UnitrainError(
        f"dist.nnodes={dist.nnodes}: the other node(s) did not join at {dist.master_addr}:{dist.master_port} "
        f"within dist.timeout_s={dist.timeout_s:g}s; start the same command on every node (dist.node_rank=0..{dist.nnodes - 1})"
    )


def dies_with_this_process():
    """A ``preexec_fn``: the child gets SIGKILL when this process ends, however it ends. (The
    kernel sends it when the *thread* that started the child ends: start it from one that
    lives as long as the job, as the main thread does here.)"""
    parent = os.getpid()

    def preexec() -> None:
        lifeline.die_with_parent()
        # This process may have died between fork and prctl: then no signal would ever come.
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


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
    ps_env: Dict[str, str] = {}

    @abstractmethod
    def options(self, dist: DistConfig, run_dir: Path) -> List[str]: ...

    @abstractmethod
    def ps_options(self, dist: DistConfig, run_dir: Path) -> List[str]:
        """The launcher's options for dist.ps.servers servers and dist.ps.trainers trainers."""

    def known_failure(self, dist: DistConfig, launcher_log: str, worker_logs: List[str], started: bool) -> Optional[UnitrainError]:
        """A failure of the launcher's own (rendezvous, port) said in one line, or None. ``started``:
        whether any worker reported (the launcher's rendezvous comes before its first worker)."""
        return None

    def command(self, dist: DistConfig, run_dir: Path, config_file: Path, backend: str = "") -> List[str]:
        worker_args = ["--config", str(config_file), "--run-dir", str(run_dir)] + main_process_args()
        worker_args += ["--rank-env", self.rank_env, "--local-rank-env", self.local_rank_env]
        if not self.writes_workerlogs:
            worker_args.append("--workerlog")
        if dist.mode == "ps":
            worker_args += ["--ps", backend, str(dist.ps.servers), str(dist.ps.trainers)]
            options = self.ps_options(dist, run_dir)
        else:
            options = self.options(dist, run_dir)
        return [sys.executable, "-m", self.module, *options, str(WORKER_SCRIPT), *worker_args]


class PaddleLauncher(Launcher):
    module, writes_workerlogs = "paddle.distributed.launch", True
    rank_env, local_rank_env = "PADDLE_TRAINER_ID", "PADDLE_LOCAL_RANK"
    # Its HTTP master waits for the other nodes with no time limit (--elastic_timeout only
    # applies to etcd:// masters): the main process keeps the clock.
    times_out_rendezvous = False

    def options(self, dist: DistConfig, run_dir: Path) -> List[str]:
        # --max_restart 0: a failed worker ends the job (paddle's default restarts it 3 times).
        opts = ["--nproc_per_node", str(dist.nproc_per_node), "--nnodes", str(dist.nnodes)]
        opts += ["--log_dir", str(run_dir), "--max_restart", "0"]
        if dist.nnodes > 1:
            opts += ["--master", f"{dist.master_addr}:{dist.master_port}", "--rank", str(dist.node_rank)]
        elif dist.master_port is not None:
            # On one node --master is never contacted and the workers' store takes a random
            # port; with --ips and --start_port the store (PADDLE_MASTER) is <ips>:<start_port>.
            opts += ["--ips", dist.master_addr, "--start_port", str(dist.master_port)]
        return opts

    # Parameter-server mode is static graph only, and Paddle's sparse tables fail under PIR.
    ps_env = {"FLAGS_enable_pir_api": "0"}

    def ps_options(self, dist: DistConfig, run_dir: Path) -> List[str]:
        # --server_num/--trainer_num select the parameter-server controller (--worker_num would
        # silently fall back to the legacy launcher); it writes serverlog.N and workerlog.N.
        opts = ["--server_num", str(dist.ps.servers), "--trainer_num", str(dist.ps.trainers), "--log_dir", str(run_dir)]
        return opts + ["--max_restart", "0"]

    def known_failure(self, dist: DistConfig, launcher_log: str, worker_logs: List[str], started: bool) -> Optional[UnitrainError]:
        # Rank 0 creates the store on the master port; a busy one aborts it in libuv.
        if dist.node_rank == 0 and worker_logs and "TCPServer::create" in worker_logs[0]:
            return busy_port_error(dist.master_port) if dist.master_port else UnitrainError(
                "paddle's workers could not listen on the port paddle.distributed.launch chose; set a free dist.master_port"
            )
        return None


class TorchLauncher(Launcher):
    module, writes_workerlogs = "torch.distributed.run", False
    rank_env, local_rank_env = "RANK", "LOCAL_RANK"
    times_out_rendezvous = True

    def options(self, dist: DistConfig, run_dir: Path) -> List[str]:
        # A fresh port per job: sweeps run jobs back to back, and a port in TIME_WAIT would clash.
        port = dist.master_port or free_port()
        opts = ["--nproc_per_node", str(dist.nproc_per_node), "--nnodes", str(dist.nnodes), "--node_rank", str(dist.node_rank)]
        opts += ["--master_addr", dist.master_addr, "--master_port", str(port), "--max_restarts", "0"]
        if dist.nnodes > 1:
            # The static rendezvous (a TCPStore on node 0) waits this long for the other nodes,
            # node 0 for clients, the others to connect; it takes whole seconds (default 600).
            opts += ["--rdzv-conf", f"timeout={math.ceil(dist.timeout_s)}"]
        return opts

    def ps_options(self, dist: DistConfig, run_dir: Path) -> List[str]:
        # Servers and trainers are all torchrun's workers: the first dist.ps.servers ranks serve.
        port = dist.master_port or free_port()
        opts = ["--nproc_per_node", str(dist.ps.servers + dist.ps.trainers), "--nnodes", "1"]
        return opts + ["--master_addr", dist.master_addr, "--master_port", str(port), "--max_restarts", "0"]

    def known_failure(self, dist: DistConfig, launcher_log: str, worker_logs: List[str], started: bool) -> Optional[UnitrainError]:
        if started:
            return None
        if "EADDRINUSE" in launcher_log:
            return busy_port_error(dist.master_port) if dist.master_port else None
        if dist.nnodes > 1 and ("waiting for clients" in launcher_log or "client socket has timed out" in launcher_log):
            return not_joined_error(dist)
        return None


LAUNCHERS: Registry[Launcher] = Registry("launcher")
LAUNCHERS.register("paddle", PaddleLauncher())
LAUNCHERS.register("torch", TorchLauncher())


class LogFollower:
    """Echo the lines a worker appends to its log, as ``tail -f`` would, but only unitrain's own:
    the frameworks' start-up output (topology tables, flag dumps, warnings) stays in the file.

    A unitrain record starts with ``[<time>][unitrain]`` (or ``unitrain:``) and may go on over
    lines of its own (tables); a line that starts any other record ends it."""

    OWN = re.compile(r"^(\[[0-9-]+ [0-9:,]+\]\[unitrain\]|unitrain(\.\w+)?: )")
    # torchrun prefixes a failed worker's traceback with "[rank<r>]:".
    FOREIGN = re.compile(r"^(\[?\d{4}-\d\d-\d\d[ ,]|[IWEF]\d{4} |\S+\.py:\d+: \w*Warning|LAUNCH|Traceback|\*\*\*|\[rank\d+\]:)")

    def __init__(self, path: Path, prefix: str):
        self.path, self.prefix, self.offset, self.partial = path, prefix, 0, ""
        self.echoing = False

    def pump(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8", errors="replace") as f:
            f.seek(self.offset)
            text = self.partial + f.read()
            self.offset = f.tell()
        *lines, self.partial = text.split("\n")
        for line in lines:
            if self.OWN.match(line):
                self.echoing = True
            elif self.FOREIGN.match(line):
                self.echoing = False
            if self.echoing:
                print(f"{self.prefix}{line}", flush=True)


def worker_statuses(run_dir: Path) -> List[Dict[str, Any]]:
    folder = run_dir / ".workers"
    return sorted((json.loads(f.read_text()) for f in folder.glob("rank*.json")), key=lambda s: s["rank"]) if folder.exists() else []


def main_process_args() -> List[str]:
    """Who the workers watch: this process, by pid and start time (a pid can be reused)."""
    return ["--main-pid", str(os.getpid()), "--main-start", lifeline.start_time(os.getpid()) or ""]


def _children(pid: int) -> List[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def _job_processes(proc: subprocess.Popen, run_dir: Path) -> Dict[int, str]:
    """pid -> start time of every process of the job still there: the launcher's descendants
    (both launchers start each worker in a session of its own, out of reach of killpg) and the
    workers still marked running (reparented to init if the launcher is gone already)."""
    found: Dict[int, Optional[str]] = {}
    for s in worker_statuses(run_dir):
        start = lifeline.start_time(s["pid"])
        if s["status"] == "running" and start is not None and s.get("start", start) == start:
            found[s["pid"]] = start
    # The workers' own children too: a process a worker forked (Paddle's parameter server 0
    # forks its gloo key-value server) inherits neither its parent-death signal nor its watchdog.
    todo = [proc.pid, *found]
    while todo:
        for child in _children(todo.pop()):
            if child not in found:
                found[child] = lifeline.start_time(child)
                todo.append(child)
    return {pid: start for pid, start in found.items() if start is not None}


def _still_there(pids: Dict[int, str]) -> Dict[int, str]:
    return {pid: start for pid, start in pids.items() if lifeline.start_time(pid) == start and not _zombie(pid)}


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def exited(proc: subprocess.Popen) -> bool:
    """Whether the launcher has exited, without reaping it: while it is a zombie its pid, which
    is also its process group's id, cannot be given to another process."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def stop_everything(proc: subprocess.Popen, run_dir: Path) -> None:
    """End the launcher's process group, its descendants and every worker still marked running,
    then reap the launcher: no orphans. A pid is signalled only while its start time is the one
    seen, never a reused one."""
    pids: Dict[int, str] = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        # Looked up again before SIGKILL (a worker may have started meanwhile), keeping those seen
        # before: SIGTERM may already have ended the launcher and orphaned them.
        pids = _still_there({**pids, **_job_processes(proc, run_dir)})
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and (not exited(proc) or _still_there(pids)):
            time.sleep(0.05)
        if exited(proc) and not _still_there(pids):
            break
    proc.wait()


def _last_lines(path: Path, lines: int = LOG_TAIL_LINES) -> List[str]:
    return path.read_text(encoding="utf-8", errors="replace").rstrip("\n").splitlines()[-lines:] if path.exists() else []


def _tail(path: Path) -> str:
    return "\n".join(f"    {line}" for line in _last_lines(path)) if path.exists() else f"(no {path.name})"


def _log_of(status: Dict[str, Any]) -> str:
    return status.get("log") or f"workerlog.{status['local_rank']}"


def _name_of(status: Dict[str, Any]) -> str:
    return status.get("name") or f"rank {status['rank']}"


def _lost_a_peer(run_dir: Path, status: Dict[str, Any]) -> bool:
    # Far enough back to get past a C++ stack dump printed after the error.
    text = status.get("error", "") + "\n".join(_last_lines(run_dir / _log_of(status), 400))
    return any(marker in text for marker in PEER_LOSS_MARKERS)


class DeathWatch:
    """When each worker still marked running was first seen gone, polled from the main process:
    of two ranks that both ended without a word, the first to go brought the job down, the
    other was stopped after it (by the launcher, whose SIGTERM a rank blocked in a collective
    cannot act on)."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.gone = run_dir, {}  # rank -> time.monotonic() when first seen gone

    def poll(self) -> None:
        for s in worker_statuses(self.run_dir):
            if s["status"] == "running" and s["rank"] not in self.gone:
                start = lifeline.start_time(s["pid"])
                if start is None or s.get("start", start) != start or _zombie(s["pid"]):
                    self.gone[s["rank"]] = time.monotonic()


def diagnose(
    run_dir: Path, launcher: Launcher, returncode: int, dist: Optional[DistConfig] = None, gone: Optional[Dict[int, float]] = None
) -> UnitrainError:
    """Name the rank that brought the job down, with the tail of its log."""
    statuses = worker_statuses(run_dir)
    if dist is not None:
        read = lambda p: p.read_text(encoding="utf-8", errors="replace") if p.exists() else ""  # noqa: E731
        worker_logs = [read(run_dir / f"workerlog.{i}") for i in range(dist.ps.trainers if dist.mode == "ps" else dist.nproc_per_node)]
        known = launcher.known_failure(dist, read(run_dir / "launcher.log"), worker_logs, bool(statuses))
        if known is not None:
            return known
    failed = sorted((s for s in statuses if s["status"] == "failed"), key=lambda s: s["time"])
    user_errors = {s["error"] for s in failed if s.get("user_error")}
    if len(user_errors) == 1 and len(failed) == len(statuses):
        return UnitrainError(user_errors.pop())  # every rank rejected the same setting
    # A worker still marked "running" ended without a word (killed by a signal, or crashed hard).
    # Ranks whose log says a peer went away died of another's death, not their own.
    # A rank "terminated" was stopped by the launcher after another one failed.
    ended = [s for s in statuses if s["status"] in ("running", "failed")]
    causes = [s for s in ended if not _lost_a_peer(run_dir, s)]
    vanished = [s for s in causes if s["status"] == "running"]
    gone = gone or {}
    after = []
    if len(vanished) > 1 and all(s["rank"] in gone for s in vanished):
        # Seen gone in different polls: the later ones died of the first one's death.
        first = min(gone[s["rank"]] for s in vanished)
        after = [s for s in vanished if gone[s["rank"]] > first + 2 * DEATH_POLL_S]
        vanished = [s for s in vanished if s not in after]
    culprits = vanished or sorted(causes, key=lambda s: s.get("time", 0))[:1] or ended
    followers = [s["rank"] for s in ended if s not in culprits and s not in after]
    stopped = [s["rank"] for s in statuses if s["status"] == "terminated"]
    if not culprits:
        return WorkerFailedError(
            f"{launcher.module} exited with code {returncode} before any worker reported; its output:\n{_tail(run_dir / 'launcher.log')}"
        )
    lines = []
    for s in culprits:
        why = f"failed: {s['error']}" if s["status"] == "failed" else "stopped without reporting (killed by a signal?)"
        lines.append(f"{_name_of(s)} {why}")
    plural = lambda names: ", ".join(names) if any(not n.startswith("rank ") for n in names) else "rank(s) " + ", ".join(n[5:] for n in names)  # noqa: E731
    if followers:
        lines.append(f"{plural([_name_of(s) for s in ended if s['rank'] in followers])} then lost the connection to it")
    if stopped:
        lines.append(f"{plural([_name_of(s) for s in statuses if s['rank'] in stopped])} were then stopped by the launcher")
    if after:
        lines.append(f"{plural([_name_of(s) for s in after])} ended after it (the launcher stops the others when one fails)")
    worst = run_dir / _log_of(culprits[0])
    return WorkerFailedError(f"{'; '.join(lines)}; {launcher.module} exited with code {returncode}\nlast lines of {worst}:\n{_tail(worst)}")


def processes_per_node(cfg: UnitrainConfig) -> int:
    return max(1, cfg.dist.ps.servers + cfg.dist.ps.trainers) if cfg.dist.mode == "ps" else cfg.dist.nproc_per_node


def write_worker_config(cfg: UnitrainConfig, run_dir: Path) -> Path:
    """The resolved config the workers load (threads resolved to each worker's share)."""
    worker_cfg = OmegaConf.to_container(cfg, resolve=True)
    worker_cfg["trainer"]["threads"] = resolve_threads(cfg.trainer.threads, processes_per_node(cfg))
    config_file = run_dir / "worker_config.yaml"
    OmegaConf.save(OmegaConf.create(worker_cfg), config_file)
    return config_file


def _finished(run_dir: Path) -> Optional[Dict[str, Any]]:
    """Rank 0's summary; a resume that found nothing left to run says so instead."""
    left = [s["nothing_left"] for s in worker_statuses(run_dir) if s.get("nothing_left")]
    if left:
        raise NothingLeftToRun(left[0])
    return _read_summary(run_dir)


def _read_summary(run_dir: Path) -> Optional[Dict[str, Any]]:
    summary_file = run_dir / "summary.json"
    return json.loads(summary_file.read_text()) if summary_file.exists() else None


def run_isolated(cfg: UnitrainConfig, run_dir: str | Path) -> Optional[Dict[str, Any]]:
    """One process, but a fresh one: for sweeps, whose jobs Hydra runs one after another in its
    own process. Each job then starts with no framework loaded by an earlier job, so its peak
    memory, threads and start-up are its own."""
    run_dir = Path(run_dir).resolve()
    config_file = write_worker_config(cfg, run_dir)
    command = [sys.executable, str(WORKER_SCRIPT), "--config", str(config_file), "--run-dir", str(run_dir), *main_process_args()]
    command += ["--rank-env", "RANK", "--local-rank-env", "LOCAL_RANK"]
    # Output goes straight to this terminal; the child dies with this process, however it ends.
    proc = subprocess.Popen(command, preexec_fn=dies_with_this_process())
    try:
        returncode = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if returncode != 0:
        failed = [s for s in worker_statuses(run_dir) if s["status"] == "failed" and s.get("user_error")]
        raise UnitrainError(failed[0]["error"]) if failed else WorkerFailedError(f"the training process exited with code {returncode}")
    return _finished(run_dir)


def check_before_launch(cfg: UnitrainConfig) -> None:
    """What would fail deep inside a launcher, said in one line before it starts."""
    dist = cfg.dist
    cores = available_cores()
    if cfg.backend.device != "gpu" and dist.nproc_per_node > cores:
        log.warning("dist.nproc_per_node=%d is more than the %d cores this process may use: the workers will compete for them", dist.nproc_per_node, cores)
    # Node 0 listens on the master port (torchrun's store, Paddle's HTTP master or, on one
    # node, its workers' store); the others only connect to it.
    if dist.master_port is not None and dist.node_rank == 0:
        why = port_in_use(dist.master_port)
        if why:
            raise busy_port_error(dist.master_port, why)


def launch(cfg: UnitrainConfig, run_dir: str | Path) -> Optional[Dict[str, Any]]:
    """Run ``cfg`` data-parallel; returns rank 0's summary (None on nodes other than node 0)."""
    run_dir = Path(run_dir).resolve()
    launcher = LAUNCHERS.get(cfg.backend.name)
    check_before_launch(cfg)
    config_file = write_worker_config(cfg, run_dir)

    command = launcher.command(cfg.dist, run_dir, config_file, cfg.backend.name)
    log.info("launching %d worker(s) on this node: %s", cfg.dist.nproc_per_node, shlex.join(command))
    # This node's first worker: rank 0 of the job on node 0.
    follower = LogFollower(run_dir / "workerlog.0", f"[rank {cfg.dist.node_rank * cfg.dist.nproc_per_node}] ")
    supervise(cfg, run_dir, launcher, command, follower)
    return _finished(run_dir)


def supervise(
    cfg: UnitrainConfig, run_dir: Path, launcher: Launcher, command: List[str], follower: LogFollower, env: Optional[Dict[str, str]] = None,
    cwd: Optional[Path] = None,
) -> None:  # fmt: skip
    """Run the framework's launcher to its end, echoing ``follower``'s log; then stop whatever
    of the job is left, and raise naming the process that failed, if one did."""
    waiting = cfg.dist.nnodes > 1
    if waiting:
        log.info("waiting up to %gs (dist.timeout_s) for all %d nodes to join at %s:%s", cfg.dist.timeout_s, cfg.dist.nnodes,
                 cfg.dist.master_addr, cfg.dist.master_port)  # fmt: skip
    # A launcher that times out the rendezvous itself says why; this clock is the backstop.
    patience = cfg.dist.timeout_s + (RENDEZVOUS_GRACE_S if launcher.times_out_rendezvous else 0.0)
    started = time.monotonic()
    deaths = DeathWatch(run_dir)
    with open(run_dir / "launcher.log", "w") as launcher_log:
        # A session of its own, so that the whole tree can be ended whatever happens here; the
        # parent-death signal ends the launcher even when this process is killed outright.
        proc = subprocess.Popen(
            command, stdout=launcher_log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=dies_with_this_process(),
            env={**os.environ, **env} if env else None, cwd=cwd,
        )  # fmt: skip
        try:
            # Not proc.poll(): that would reap the launcher before its group is stopped.
            while not exited(proc):
                follower.pump()
                deaths.poll()
                # Both launchers rendezvous before they start any worker: no worker status
                # yet means some node has not joined.
                if waiting and worker_statuses(run_dir):
                    waiting = False
                elif waiting and time.monotonic() - started > patience:
                    raise not_joined_error(cfg.dist)
                time.sleep(DEATH_POLL_S)
            follower.pump()
            deaths.poll()
        finally:
            stop_everything(proc, run_dir)
    if proc.returncode != 0:
        raise diagnose(run_dir, launcher, proc.returncode, cfg.dist, deaths.gone)


def ps_engine_problem(cfg: UnitrainConfig, launcher: Launcher) -> Optional[str]:
    """Why the installed framework cannot run a parameter-server job, asked of the backend's ps
    module in a child process (this one imports no framework), or None."""
    probe = f"import unitrain.backends.{cfg.backend.name}.ps as m; print(m.engine_problem() or '')"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, **launcher.ps_env})
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"backend={cfg.backend.name} could not be loaded for a parameter-server job: {tail}"
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else None


def launch_ps(cfg: UnitrainConfig, run_dir: str | Path) -> Dict[str, Any]:
    """Run a parameter-server job (dist.mode=ps) through the framework's launcher, or, with
    dist.ps.servers=0, its one process directly; returns the job's summary."""
    from unitrain.ps import job as ps

    run_dir = Path(run_dir).resolve()
    launcher = LAUNCHERS.get(cfg.backend.name)
    problem = ps_engine_problem(cfg, launcher)
    if problem:
        raise UnitrainError(problem)
    if cfg.data.path:
        # The job runs in its run directory (below), where relative paths would not resolve.
        cfg.data.path = os.path.abspath(cfg.data.path)
    config_file = write_worker_config(cfg, run_dir)
    if cfg.dist.ps.servers:
        command = launcher.command(cfg.dist, run_dir, config_file, cfg.backend.name)
        log.info("launching %d server(s) and %d trainer(s): %s", cfg.dist.ps.servers, cfg.dist.ps.trainers, shlex.join(command))
    else:
        command = [sys.executable, str(WORKER_SCRIPT), "--config", str(config_file), "--run-dir", str(run_dir), *main_process_args()]
        command += ["--rank-env", "RANK", "--local-rank-env", "LOCAL_RANK", "--workerlog", "--ps", cfg.backend.name, "0", "1"]
    follower = LogFollower(run_dir / "workerlog.0", "[trainer 0] ")
    started = time.monotonic()
    # In the run directory: Paddle's servers write http.log (their gloo key-value store's) into
    # their working directory.
    supervise(cfg, run_dir, launcher, command, follower, env=launcher.ps_env, cwd=run_dir)
    return ps.summarize(cfg, run_dir, time.monotonic() - started)
