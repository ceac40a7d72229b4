"""A job's processes through the frameworks' own launchers (paddle.distributed.launch, torchrun),
or one fresh process: the machinery every kind of job (``unitrain.jobs``) starts its processes
with.

The main process (the Hydra job) writes the resolved config into the run directory, starts the
launcher with unitrain's worker script, shows one process's log as it grows, and when the
launcher ends makes sure nothing it started is left running. It imports no framework itself.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Protocol

from omegaconf import OmegaConf

from unitrain.config.schema import UnitrainConfig
from unitrain.errors import NothingLeftToRun, Refusal, UnitrainError
from unitrain.host.network import node_network
from unitrain.host.ports import port_in_use
from unitrain.host.threads import available_cores, resolve_threads
from unitrain.interface.launch import Beside, Launcher, busy_port_error, not_joined_error
from unitrain.launch.diagnosis import DeathWatch, WorkerFailedError, diagnose
from unitrain.launch.workers import (
    DEATH_POLL_S,
    LogFollower,
    dies_with_this_process,
    exited,
    main_process_args,
    stop_everything,
    worker_statuses,
)

log = logging.getLogger("unitrain")

#: What the launchers start: found, not imported (it sits above the layers it starts).
WORKER_SCRIPT = Path(importlib.util.find_spec("unitrain.entry.worker").origin).resolve()
# How long past dist.timeout_s the main process waits for a launcher that times out the
# rendezvous itself (torchrun): its own start-up (imports) comes before its clock starts.
RENDEZVOUS_GRACE_S = 30.0


def write_worker_config(cfg: UnitrainConfig, run_dir: Path, processes: int) -> Path:
    """The resolved config the workers load, threads resolved to the share of each of this
    node's ``processes``."""
    worker_cfg = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    worker_cfg["trainer"]["threads"] = resolve_threads(cfg.trainer.threads, processes)
    if cfg.trainer.threads is None:
        log.info(
            "trainer.threads unset: %d thread(s) for each of this node's %d process(es) (%d cores); the same job "
            "laid out otherwise (2 hosts x 1 process against 1 host x 2) gets other counts, and matches this one bit "
            "for bit only with trainer.threads set",
            worker_cfg["trainer"]["threads"],
            processes,
            available_cores(),
        )
    config_file = run_dir / "worker_config.yaml"
    OmegaConf.save(OmegaConf.create(worker_cfg), config_file)
    return config_file


def finished(run_dir: Path) -> Optional[Dict[str, Any]]:
    """Rank 0's summary; a resume that found nothing left to run says so instead."""
    left = [s["nothing_left"] for s in worker_statuses(run_dir) if s.get("nothing_left")]
    if left:
        raise NothingLeftToRun(left[0])
    return _read_summary(run_dir)


def _read_summary(run_dir: Path) -> Optional[Dict[str, Any]]:
    summary_file = run_dir / "summary.json"
    return json.loads(summary_file.read_text()) if summary_file.exists() else None


def worker_command(config_file: Path, run_dir: Path, rank_env: str, local_rank_env: str, *extra: str) -> List[str]:
    """unitrain's worker script with its arguments, as a launcher or this process starts it."""
    command = [str(WORKER_SCRIPT), "--config", str(config_file), "--run-dir", str(run_dir), *main_process_args()]
    return command + ["--rank-env", rank_env, "--local-rank-env", local_rank_env, *extra]


def launcher_command(
    launcher: Launcher, options: List[str], worker_args: List[str], config_file: Path, run_dir: Path, beside: Beside
) -> List[str]:
    """``python -m <launcher> <its options> <worker script> <worker arguments>``."""
    extra = ([] if launcher.writes_workerlogs else ["--workerlog"]) + worker_args
    worker = worker_command(config_file, run_dir, launcher.rank_env, launcher.local_rank_env, *extra)
    return [sys.executable, "-m", beside.module or launcher.module, *options, *beside.options, *worker]


def run_isolated(cfg: UnitrainConfig, run_dir: str | Path) -> Optional[Dict[str, Any]]:
    """One process, but a fresh one: for sweeps, whose jobs Hydra runs one after another in its
    own process. Each job then starts with no framework loaded by an earlier job, so its peak
    memory, threads and start-up are its own."""
    run_dir = Path(run_dir).resolve()
    config_file = write_worker_config(cfg, run_dir, 1)
    command = [sys.executable, *worker_command(config_file, run_dir, "RANK", "LOCAL_RANK", "--console")]
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
        if failed:
            # The process printed it on this console already: the error says so, and keeps its status.
            err = (Refusal if failed[0].get("refusal") else UnitrainError)(failed[0]["error"])
            err.exit_code, err.already_said = failed[0].get("exit_code", returncode), True
            raise err
        raise WorkerFailedError(f"the training process exited with code {returncode}")
    return finished(run_dir)


def check_before_launch(cfg: UnitrainConfig, count: int, what: str) -> None:
    """What would fail deep inside a launcher, said in one line before it starts; and a warning
    for more processes (``count`` on this node, set by the keys ``what``) than cores."""
    dist = cfg.dist
    cores = available_cores()
    if cfg.backend.device != "gpu" and count > cores:
        log.warning(
            "%s=%d is more than the %d cores this process may use: the processes will compete for them",
            what,
            count,
            cores,
        )
    # Checked before the job too (jobs/machine.py); a port taken since is said here. Node 0
    # listens on the master port (torchrun's store, Paddle's HTTP master or, on one node, its
    # workers' store); the others only connect to it.
    if dist.master_port is not None and dist.node_rank == 0:
        why = port_in_use(dist.master_port)
        if why:
            raise busy_port_error(dist.master_port, why)


def network_env(dist: Any, launcher: Launcher) -> Dict[str, str]:
    """Several nodes (or a named dist.interface): the interface this node talks on, set for the
    launcher and its workers."""
    if dist.nnodes == 1 and dist.interface is None:
        return {}
    network = node_network(dist.interface, dist.master_addr)
    log.info("node %d talks on %s (%s)", dist.node_rank, network.interface, network.address)
    return launcher.network_env(network)


class NodeWatch(Protocol):
    """How the main process tells that the other nodes joined, and that they are still there."""

    def joined(self) -> bool: ...

    def check(self) -> None:
        """Raise once the other nodes are lost (after :meth:`joined`)."""


@dataclass(frozen=True)
class WorkersReported:
    """The launchers' rendezvous: both start a data-parallel worker only once every node joined,
    so a worker's first report says they did; losing a node is the launcher's to see."""

    run_dir: Path

    def joined(self) -> bool:
        return bool(worker_statuses(self.run_dir))

    def check(self) -> None:
        pass


@dataclass(frozen=True, kw_only=True)
class Launch:
    """This node's share of a job, as the framework's launcher (or one process) runs it."""

    launcher: Launcher
    command: List[str]
    follower: LogFollower
    #: This node's processes that write workerlog.<i> (where a launcher's failure shows).
    workers: int
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Optional[Path] = None
    nodes: Optional[NodeWatch] = None  # over several nodes: when they joined, when lost


def supervise(cfg: UnitrainConfig, run_dir: Path, launch: Launch) -> None:
    """Run the framework's launcher to its end, echoing its follower's log; then stop whatever
    of the job is left, and raise naming the process that failed, if one did."""
    dist = cfg.dist
    if dist.nnodes > 1:
        log.info(
            "waiting up to %gs (dist.timeout_s) for all %d nodes to join at %s:%s",
            dist.timeout_s,
            dist.nnodes,
            dist.master_addr,
            dist.master_port,
        )
    deaths = DeathWatch(run_dir)
    with open(run_dir / "launcher.log", "w") as launcher_log:
        # A session of its own, so that the whole tree can be ended whatever happens here; the
        # parent-death signal ends the launcher even when this process is killed outright.
        proc = subprocess.Popen(
            launch.command,
            stdout=launcher_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=dies_with_this_process(),
            env={**os.environ, **launch.env} if launch.env else None,
            cwd=launch.cwd,
        )
        try:
            _watch(proc, cfg, launch, deaths)
        finally:
            stop_everything(proc, run_dir)
    if proc.returncode != 0:
        raise diagnose(run_dir, launch.launcher, proc.returncode, dist, deaths.gone, launch.workers)


def _refusal(run_dir: Path) -> Optional[Refusal]:
    """The refusal a worker ended with, if one did."""
    for status in worker_statuses(run_dir):
        if status["status"] == "failed" and status.get("refusal"):
            return Refusal(status["error"])
    return None


def _watch(proc: subprocess.Popen, cfg: UnitrainConfig, launch: Launch, deaths: DeathWatch) -> None:
    """Until the launcher exits: echo the log, note each worker's death, and keep the clock on
    nodes that have not joined (a launcher that times out the rendezvous itself says why; this
    clock is the backstop)."""
    nodes = launch.nodes if cfg.dist.nnodes > 1 else None
    waiting = nodes is not None
    # A launcher that restarts failed workers would restart one that refused its config or data
    # too, over and over: a refusal is not a fault that passes, and ends the job at once.
    restarting = cfg.dist.max_restarts > 0
    patience = cfg.dist.timeout_s + (RENDEZVOUS_GRACE_S if launch.launcher.times_out_rendezvous else 0.0)
    started = time.monotonic()
    # Not proc.poll(): that would reap the launcher before its group is stopped.
    while not exited(proc):
        launch.follower.pump()
        deaths.poll()
        refused = _refusal(deaths.run_dir) if restarting else None
        if refused is not None:
            raise refused
        if waiting and nodes.joined():
            waiting = False
        elif waiting and time.monotonic() - started > patience:
            raise not_joined_error(cfg.dist)
        elif nodes and not waiting:
            nodes.check()
        time.sleep(DEATH_POLL_S)
    launch.follower.pump()
    deaths.poll()
