"""Data-parallel jobs through the frameworks' own launchers: paddle.distributed.launch, torchrun.

The main process (the Hydra job) writes the resolved config into the run directory, starts the
launcher with unitrain's worker script, shows rank 0's log as it grows, and when the launcher
ends makes sure nothing it started is left running. It imports no framework itself.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from omegaconf import OmegaConf

from unitrain.config.schema import UnitrainConfig
from unitrain.config.validation import processes_per_node
from unitrain.entry import worker
from unitrain.errors import NothingLeftToRun, Refusal, UnitrainError
from unitrain.host.network import addresses, node_network
from unitrain.host.ports import port_in_use
from unitrain.host.threads import available_cores, resolve_threads
from unitrain.interface.launch import Beside, Launcher, busy_port_error, launch_module, not_joined_error
from unitrain.interface.modules import module_path
from unitrain.interface.ps import PsLayout
from unitrain.launch.diagnosis import DeathWatch, WorkerFailedError, diagnose
from unitrain.launch.ps_nodes import PsNodeWatch
from unitrain.launch.workers import (
    DEATH_POLL_S,
    LogFollower,
    dies_with_this_process,
    exited,
    main_process_args,
    stop_everything,
    worker_statuses,
)
from unitrain.ps import checkpoint as ps_checkpoint
from unitrain.ps.job import summarize
from unitrain.train import restarts

log = logging.getLogger("unitrain")

WORKER_SCRIPT = Path(worker.__file__).resolve()
# How long past dist.timeout_s the main process waits for a launcher that times out the
# rendezvous itself (torchrun): its own start-up (imports) comes before its clock starts.
RENDEZVOUS_GRACE_S = 30.0


def write_worker_config(cfg: UnitrainConfig, run_dir: Path) -> Path:
    """The resolved config the workers load (threads resolved to each worker's share)."""
    worker_cfg = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
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


def worker_command(config_file: Path, run_dir: Path, rank_env: str, local_rank_env: str, *extra: str) -> List[str]:
    """unitrain's worker script with its arguments, as a launcher or this process starts it."""
    command = [str(WORKER_SCRIPT), "--config", str(config_file), "--run-dir", str(run_dir), *main_process_args()]
    return command + ["--rank-env", rank_env, "--local-rank-env", local_rank_env, *extra]


def launcher_command(
    launcher: Launcher, cfg: UnitrainConfig, run_dir: Path, config_file: Path, beside: Optional[Beside] = None
) -> List[str]:
    """``python -m <launcher> <its options> <worker script> <worker arguments>``."""
    dist = cfg.dist
    extra = [] if launcher.writes_workerlogs else ["--workerlog"]
    if dist.mode == "ps":
        extra += ["--ps", cfg.backend.name, str(dist.node_rank), *PsLayout.of(dist.ps, dist.nnodes).arguments()]
    options = launcher.ps_options(dist, run_dir) if dist.mode == "ps" else launcher.options(dist, run_dir)
    worker = worker_command(config_file, run_dir, launcher.rank_env, launcher.local_rank_env, *extra)
    more = beside.options if beside else []
    return [sys.executable, "-m", launcher.module, *options, *more, *worker]


def run_isolated(cfg: UnitrainConfig, run_dir: str | Path) -> Optional[Dict[str, Any]]:
    """One process, but a fresh one: for sweeps, whose jobs Hydra runs one after another in its
    own process. Each job then starts with no framework loaded by an earlier job, so its peak
    memory, threads and start-up are its own."""
    run_dir = Path(run_dir).resolve()
    config_file = write_worker_config(cfg, run_dir)
    command = [sys.executable, *worker_command(config_file, run_dir, "RANK", "LOCAL_RANK")]
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
            raise (Refusal if failed[0].get("refusal") else UnitrainError)(failed[0]["error"])
        raise WorkerFailedError(f"the training process exited with code {returncode}")
    return _finished(run_dir)


def check_before_launch(cfg: UnitrainConfig) -> None:
    """What would fail deep inside a launcher, said in one line before it starts; and a warning
    for more processes than cores."""
    dist = cfg.dist
    cores, count = available_cores(), processes_per_node(cfg)
    if cfg.backend.device != "gpu" and count > cores:
        what = "dist.ps.servers + dist.ps.trainers" if dist.mode == "ps" else "dist.nproc_per_node"
        log.warning(
            "%s=%d is more than the %d cores this process may use: the processes will compete for them",
            what,
            count,
            cores,
        )
    if dist.nnodes > 1:
        try:
            socket.getaddrinfo(dist.master_addr, dist.master_port)
        except OSError as err:
            raise UnitrainError(
                f"dist.master_addr={dist.master_addr!r} is not allowed: it does not resolve ({err.strerror or err}); "
                "allowed: an address or host name of node 0 that every node can reach"
            ) from None
    # Node 0 listens on the master port (torchrun's store, Paddle's HTTP master or, on one
    # node, its workers' store); the others only connect to it.
    if dist.master_port is not None and dist.node_rank == 0:
        why = port_in_use(dist.master_port)
        if why:
            raise busy_port_error(dist.master_port, why)


def launch(cfg: UnitrainConfig, run_dir: str | Path) -> Optional[Dict[str, Any]]:
    """Run ``cfg`` data-parallel; returns rank 0's summary (None on nodes other than node 0)."""
    run_dir = Path(run_dir).resolve()
    launcher = launch_module(cfg.backend.name).LAUNCHER
    check_before_launch(cfg)
    config_file = write_worker_config(cfg, run_dir)
    with launcher.beside(cfg.dist, run_dir) as beside:
        command = launcher_command(launcher, cfg, run_dir, config_file, beside)
        env = {**_network_env(cfg.dist, launcher), **beside.env}
        log.info("launching %d worker(s) on this node: %s", cfg.dist.nproc_per_node, shlex.join(command))
        # This node's first worker: rank 0 of the job on node 0.
        follower = LogFollower(run_dir / "workerlog.0", f"[rank {cfg.dist.node_rank * cfg.dist.nproc_per_node}] ")
        supervise(cfg, run_dir, launcher, command, follower, env=env)
    if cfg.dist.max_restarts:
        restarts.add_to_summary(run_dir)
    return _finished(run_dir)


def _network_env(dist: Any, launcher: Launcher) -> Dict[str, str]:
    """Several nodes (or a named dist.interface): the interface this node talks on, set for the
    launcher and its workers."""
    if dist.nnodes == 1 and dist.interface is None:
        return {}
    network = node_network(dist.interface, dist.master_addr)
    log.info("node %d talks on %s (%s)", dist.node_rank, network.interface, network.address)
    return launcher.network_env(network)


def supervise(
    cfg: UnitrainConfig,
    run_dir: Path,
    launcher: Launcher,
    command: List[str],
    follower: LogFollower,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[Path] = None,
) -> None:
    """Run the framework's launcher to its end, echoing ``follower``'s log; then stop whatever
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
            command,
            stdout=launcher_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=dies_with_this_process(),
            env={**os.environ, **env} if env else None,
            cwd=cwd,
        )
        try:
            _watch(proc, cfg, run_dir, launcher, follower, deaths)
        finally:
            stop_everything(proc, run_dir)
    if proc.returncode != 0:
        raise diagnose(run_dir, launcher, proc.returncode, dist, deaths.gone)


def _watch(
    proc: subprocess.Popen,
    cfg: UnitrainConfig,
    run_dir: Path,
    launcher: Launcher,
    follower: LogFollower,
    deaths: DeathWatch,
) -> None:
    """Until the launcher exits: echo the log, note each worker's death, and keep the clock on
    nodes that have not joined (a launcher that times out the rendezvous itself says why; this
    clock is the backstop)."""
    waiting = cfg.dist.nnodes > 1
    patience = cfg.dist.timeout_s + (RENDEZVOUS_GRACE_S if launcher.times_out_rendezvous else 0.0)
    nodes = PsNodeWatch(cfg, run_dir) if cfg.dist.mode == "ps" and waiting else None
    started = time.monotonic()
    # Not proc.poll(): that would reap the launcher before its group is stopped.
    while not exited(proc):
        follower.pump()
        deaths.poll()
        # Both launchers rendezvous before they start any data-parallel worker.
        if waiting and (nodes.joined() if nodes else bool(worker_statuses(run_dir))):
            waiting = False
        elif waiting and time.monotonic() - started > patience:
            raise not_joined_error(cfg.dist)
        elif nodes and not waiting:
            nodes.check()
        time.sleep(DEATH_POLL_S)
    follower.pump()
    deaths.poll()


def ps_engine_problem(cfg: UnitrainConfig, launcher: Launcher) -> Optional[str]:
    """Why the installed framework cannot run a parameter-server job, asked of the backend's ps
    module in a child process (this one imports no framework), or None."""
    probe = f"import {module_path(cfg.backend.name, 'ps')} as m; print(m.engine_problem() or '')"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, **launcher.ps_env}
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"backend={cfg.backend.name} could not be loaded for a parameter-server job: {tail}"
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else None


def launch_ps(cfg: UnitrainConfig, run_dir: str | Path) -> Optional[Dict[str, Any]]:
    """Run a parameter-server job (dist.mode=ps) through the framework's launcher, or, with
    dist.ps.servers=0, its one process directly; returns the job's summary (None on a node
    without trainer 0)."""
    run_dir = Path(run_dir).resolve()
    _check_ps_host(cfg.dist)
    launcher = launch_module(cfg.backend.name).LAUNCHER
    problem = ps_engine_problem(cfg, launcher)
    if problem:
        raise UnitrainError(problem)
    check_before_launch(cfg)
    # The job runs in its run directory (below), where relative paths would not resolve.
    for key in ("path", "val_path"):
        if getattr(cfg.data, key):
            setattr(cfg.data, key, os.path.abspath(getattr(cfg.data, key)))
    resumed = ps_checkpoint.find(cfg, run_dir)  # here, so that a bad one is refused once
    if resumed:
        cfg.trainer.resume = str(resumed.path)
    config_file = write_worker_config(cfg, run_dir)
    if cfg.dist.ps.servers:
        command = launcher_command(launcher, cfg, run_dir, config_file)
        log.info(
            "launching %d server(s) and %d trainer(s): %s",
            cfg.dist.ps.servers,
            cfg.dist.ps.trainers,
            shlex.join(command),
        )
    else:
        ps_args = ["--workerlog", "--ps", cfg.backend.name, "0", "0", "1"]
        command = [sys.executable, *worker_command(config_file, run_dir, "RANK", "LOCAL_RANK", *ps_args)]
    follower = _ps_follower(cfg, run_dir)
    env = {**launcher.ps_env, **_network_env(cfg.dist, launcher)}
    started = time.monotonic()
    # In the run directory: Paddle's servers write http.log (their gloo key-value store's) into
    # their working directory.
    supervise(cfg, run_dir, launcher, command, follower, env=env, cwd=run_dir)
    return summarize(cfg, run_dir, time.monotonic() - started)


def _ps_follower(cfg: UnitrainConfig, run_dir: Path) -> LogFollower:
    """This node's first trainer's log, or its first server's on a node of servers only."""
    layout = PsLayout.of(cfg.dist.ps, cfg.dist.nnodes)
    trainers = layout.trainer_indices(cfg.dist.node_rank)
    if trainers:
        return LogFollower(run_dir / "workerlog.0", f"[trainer {trainers.start}] ")
    return LogFollower(run_dir / "serverlog.0", f"[server {layout.server_indices(cfg.dist.node_rank).start}] ")


def _check_ps_host(dist: Any) -> None:
    """dist.ps.hosts names this node's address where its servers listen and trainers are found."""
    if not dist.ps.hosts or dist.nnodes == 1:
        return
    mine = dist.ps.hosts[dist.node_rank]
    if mine not in addresses().values():
        raise UnitrainError(
            f"dist.ps.hosts[{dist.node_rank}]={mine!r} is not allowed: it is not an address of this node "
            f"(dist.node_rank={dist.node_rank}); allowed: one of {', '.join(sorted(set(addresses().values())))}"
        )
