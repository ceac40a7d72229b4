"""Parameter-server jobs (``dist.mode=ps``): wide&deep on Criteo-format rows, servers holding the
parameters and trainers reading disjoint shares, through the framework's launcher (Paddle
Fleet's parameter server, torch.distributed.rpc). The processes run :mod:`unitrain.ps.job`; this
is the main process's side: the rules, the launch, the node watch and the summary."""

from __future__ import annotations

import copy
import logging
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from unitrain.config.schema import PS_DATASETS, PS_MODELS, UnitrainConfig
from unitrain.config.validation import at_least, one_of, positive
from unitrain.data import criteo_files
from unitrain.data.criteo import DENSE_FEATURES, SPARSE_SLOTS
from unitrain.errors import ConfigError, Refusal, UnitrainError
from unitrain.host.memory import available_mb
from unitrain.host.network import addresses
from unitrain.interface.launch import Beside, Launcher, launch_module
from unitrain.interface.ps import PsLayout
from unitrain.interface.validation import validation_module
from unitrain.jobs.kind import Processes, Summary
from unitrain.launch.ps_nodes import PsNodeWatch
from unitrain.launch.shared_dir import seen_by_every_node
from unitrain.launch.supervise import (
    Launch,
    check_before_launch,
    launcher_command,
    network_env,
    supervise,
    worker_command,
    write_worker_config,
)
from unitrain.launch.workers import LogFollower
from unitrain.ps import checkpoint
from unitrain.ps.engine_check import engine_problem
from unitrain.ps.job import summarize
from unitrain.spec import optimizers
from unitrain.tasks import task_of
from unitrain.tasks.click_through import from_files

log = logging.getLogger("unitrain")

_ENGINE = "with dist.ps.feed=engine (the engine runs whole passes over whole files, with no step between)"
#: What a pass run by the engine cannot have: it runs whole files with no step between.
_PER_STEP = (
    ("trainer.steps", "null"),
    ("trainer.checkpoint_every", "0"),
    ("trainer.eval_every", "0"),
    ("trainer.resume", "null"),
    ("data.num_samples", "null (every row of the files)"),
)


class ParameterServerJob:
    nodes_from_slurm = False

    def check(self, cfg: UnitrainConfig) -> None:
        _check_roles(cfg)
        _check_nodes(cfg)
        _check_training(cfg)
        _check_feed(cfg)

    def check_machine(self, cfg: UnitrainConfig) -> None:
        _check_tower_memory(cfg)
        for host in cfg.dist.ps.hosts if cfg.dist.nnodes > 1 else ():
            try:
                socket.getaddrinfo(host, None, socket.AF_INET)
            except OSError as err:
                raise ConfigError(
                    "dist.ps.hosts",
                    list(cfg.dist.ps.hosts),
                    f"every node's address or host name, resolvable ({host!r}: {err.strerror or err})",
                ) from None
        task_of(cfg).check_files(cfg)
        ps = cfg.dist.ps
        if ps.feed != "engine":
            return
        files = criteo_files.list_files(cfg.data.path)
        if len(files) < ps.trainers:
            raise ConfigError(
                "data.path",
                cfg.data.path,
                f"a folder of at least dist.ps.trainers={ps.trainers} files {_ENGINE} (it holds {len(files)})",
            )

    def check_backend(self, cfg: UnitrainConfig) -> None:
        validation_module(cfg.backend.name).check_ps(cfg)

    def processes(self, cfg: UnitrainConfig) -> Processes:
        count = max(1, PsLayout.of(cfg.dist.ps, cfg.dist.nnodes).processes(cfg.dist.node_rank))
        keys = "dist.ps.servers + dist.ps.trainers"
        return Processes(count=count, keys=keys, key="dist.ps.trainers", value=cfg.dist.ps.trainers)

    def run(self, cfg: UnitrainConfig, run_dir: Path, fresh_process: bool) -> Summary:
        return launch(cfg, run_dir, self.processes(cfg))

    def summary_node(self, cfg: UnitrainConfig) -> int:
        layout = PsLayout.of(cfg.dist.ps, cfg.dist.nnodes)
        return min(n for n in range(cfg.dist.nnodes) if layout.trainers[n])

    def summary_holder(self, cfg: UnitrainConfig) -> str:
        return f"node {self.summary_node(cfg)} (trainer 0's)"


def _check_tower_memory(cfg: UnitrainConfig) -> None:
    """The deep tower (26 embeddings and 13 dense features in, its hidden layers, one logit out)
    with its gradients and two optimizer moments, against this machine's free memory."""
    free = available_mb()
    if free is None:
        return
    widths = [SPARSE_SLOTS * cfg.model.embedding_dim + DENSE_FEATURES, *cfg.model.hidden_layers, 1]
    weights = sum(a * b + b for a, b in zip(widths, widths[1:]))
    if 16 * weights / 2**20 > free:
        raise ConfigError(
            "model.hidden_layers",
            list(cfg.model.hidden_layers),
            f"layers whose weights fit in memory: with model.embedding_dim={cfg.model.embedding_dim} this tower "
            f"would need {16 * weights / 2**30:.1f} GiB, more than the {free / 1024:.1f} GiB free here",
        )


def _check_roles(cfg: UnitrainConfig) -> None:
    """Wide&deep on Criteo rows, servers and trainers sizing the job."""
    ps = cfg.dist.ps
    if cfg.model.name not in PS_MODELS:
        raise ConfigError(
            "model",
            cfg.model.name,
            f"{' or '.join(PS_MODELS)} with dist.mode=ps (the ResNets train with dist.mode=collective)",
        )
    if cfg.data.name not in PS_DATASETS:
        raise ConfigError("data", cfg.data.name, f"one of {', '.join(PS_DATASETS)} with dist.mode=ps")
    one_of("optim.name", cfg.optim.name, optimizers.PS)
    for key in ("momentum", "weight_decay"):
        if cfg.optim[key]:
            raise ConfigError(
                f"optim.{key}",
                cfg.optim[key],
                f"0 with dist.mode=ps (the servers' rules, {', '.join(optimizers.PS)}, have none)",
            )
    if cfg.dist.max_restarts:
        raise ConfigError(
            "dist.max_restarts",
            cfg.dist.max_restarts,
            "0 with dist.mode=ps (a restarted server would come back with empty tables)",
        )
    if cfg.dist.nproc_per_node != 1:
        raise ConfigError(
            "dist.nproc_per_node",
            cfg.dist.nproc_per_node,
            "1 with dist.mode=ps (dist.ps.servers and dist.ps.trainers size the job)",
        )
    at_least("dist.ps.servers", ps.servers, 0, "0: one process without servers")
    positive("dist.ps.trainers", ps.trainers)
    if ps.servers == 0 and ps.trainers != 1:
        raise ConfigError(
            "dist.ps.trainers", ps.trainers, "1 with dist.ps.servers=0 (trainers share parameters through servers)"
        )
    positive("dist.ps.geo_k_steps", ps.geo_k_steps)
    _check_merge_pushes(ps)


def _check_merge_pushes(ps) -> None:
    """Only async trainers' pushes can wait to be merged: sync sends each step's gradients
    before its barrier, geo its changes every geo_k_steps, one process none."""
    if ps.merge_pushes == 1:
        return
    if ps.merge_pushes is not None:
        at_least("dist.ps.merge_pushes", ps.merge_pushes, 1, "1: every step is an update of its own; or null")
    if ps.servers == 0:
        raise ConfigError("dist.ps.merge_pushes", ps.merge_pushes, "1 with dist.ps.servers=0 (no servers)")
    if ps.sync != "async":
        raise ConfigError(
            "dist.ps.merge_pushes",
            ps.merge_pushes,
            f"1 with dist.ps.sync={ps.sync} (only async trainers' pushes wait to be merged)",
        )


def _check_training(cfg: UnitrainConfig) -> None:
    """The wide&deep model, in float32, one step per batch."""
    if cfg.amp.level != "O0":
        raise ConfigError("amp", cfg.amp.level, "O0 with dist.mode=ps (parameter-server jobs train in float32)")
    if cfg.trainer.accumulate_steps != 1:
        raise ConfigError("trainer.accumulate_steps", cfg.trainer.accumulate_steps, "1 with dist.mode=ps")
    positive("model.sparse_buckets", cfg.model.sparse_buckets)
    positive("model.embedding_dim", cfg.model.embedding_dim)
    for width in cfg.model.hidden_layers:
        positive("model.hidden_layers", width)


def _check_nodes(cfg: UnitrainConfig) -> None:
    """Over several nodes: where its processes run, every node alike."""
    dist, ps = cfg.dist, cfg.dist.ps
    if dist.nnodes == 1:
        for key in ("node_servers", "node_trainers", "hosts"):
            if len(ps[key]) > 1:
                raise ConfigError(f"dist.ps.{key}", list(ps[key]), "at most one entry with dist.nnodes=1")
        for key, total in (("node_servers", ps.servers), ("node_trainers", ps.trainers)):
            if list(ps[key]) not in ([], [total]):
                raise ConfigError(
                    f"dist.ps.{key}", list(ps[key]), f"[] or [{total}] (dist.ps.{key[5:]}) with dist.nnodes=1"
                )
        return
    if ps.servers == 0:
        raise ConfigError("dist.ps.servers", 0, "at least 1 with dist.nnodes > 1 (0 trains in one process)")
    for key, total in (("node_servers", ps.servers), ("node_trainers", ps.trainers)):
        counts = list(ps[key])
        if counts and (len(counts) != dist.nnodes or min(counts) < 0 or sum(counts) != total):
            raise ConfigError(
                f"dist.ps.{key}",
                counts,
                f"{dist.nnodes} counts (one per node, node 0's first) that add up to dist.ps.{key[5:]}={total}, "
                "or [] to spread them evenly",
            )
    layout = PsLayout.of(ps, dist.nnodes)
    idle = [node for node in range(dist.nnodes) if layout.processes(node) == 0]
    if idle:
        raise ConfigError(
            "dist.ps.node_servers",
            list(layout.servers),
            f"a layout in which every node runs a server or a trainer (node {idle[0]} would run nothing; "
            f"node_trainers={list(layout.trainers)})",
        )
    if ps.hosts and len(ps.hosts) != dist.nnodes:
        raise ConfigError("dist.ps.hosts", list(ps.hosts), f"{dist.nnodes} addresses, node 0's first, or []")
    for key in ("checkpoint_every", "resume"):
        if cfg.trainer[key] and not dist.shared_dir:
            # Each server writes its shard on its own host: a checkpoint would be spread over them.
            raise ConfigError(
                f"trainer.{key}",
                cfg.trainer[key],
                "unset with dist.mode=ps over several nodes (dist.nnodes > 1), unless dist.shared_dir names a "
                "directory every node reaches at the same path",
            )


def _check_feed(cfg: UnitrainConfig) -> None:
    """dist.ps.feed=engine: the engine reads each trainer's whole files and steps by itself."""
    ps = cfg.dist.ps
    positive("dist.ps.threads", ps.threads)
    if ps.feed != "engine":
        if ps.threads != 1:
            raise ConfigError("dist.ps.threads", ps.threads, "1 with dist.ps.feed=steps (threads run engine passes)")
        return
    why = _ENGINE
    if ps.sync == "sync" and ps.servers:
        raise ConfigError("dist.ps.sync", "sync", f"async or geo {why}: sync trainers meet after every step")
    files = from_files(cfg.data)
    if not files or not cfg.data.val_path:
        raise ConfigError(
            "data.val_path" if files else "data",
            cfg.data.val_path if files else cfg.data.name,
            f"data=criteo with a data.val_path {why}: the held-out rows cannot come from the training files",
        )
    for key, allowed in _PER_STEP:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value not in (None, 0):
            raise ConfigError(key, value, f"{allowed} {why}")


def launch(cfg: UnitrainConfig, run_dir: Path, processes: Processes) -> Summary:
    """Run this node's servers and trainers through the framework's launcher, or, with
    dist.ps.servers=0, the one process directly; returns the job's summary (None on a node
    without trainer 0)."""
    run_dir = Path(run_dir).resolve()
    _check_host(cfg)
    launcher = launch_module(cfg.backend.name).LAUNCHER
    problem = engine_problem(cfg.backend.name, launcher.ps_env)
    if problem:
        # This environment's framework cannot run the job as configured: nothing is left behind.
        raise Refusal(problem)
    check_before_launch(cfg, processes.count, processes.keys)
    job = _job_config(cfg, run_dir)
    config_file = write_worker_config(job, run_dir, processes.count)
    started = time.monotonic()
    with seen_by_every_node(job.dist), launcher.beside(job.dist, run_dir) as beside:
        supervise(job, run_dir, _launch(job, run_dir, launcher, config_file, beside))
    return summarize(job, run_dir, time.monotonic() - started)


def _job_config(cfg: UnitrainConfig, run_dir: Path) -> UnitrainConfig:
    """The config the processes run: paths absolute (they run in the run directory) and the
    checkpoint to resume from found here, so that a bad one is refused once. The caller's
    config is left as it was."""
    job = copy.deepcopy(cfg)
    for key in ("path", "val_path"):
        if getattr(job.data, key):
            setattr(job.data, key, os.path.abspath(getattr(job.data, key)))
    resumed = checkpoint.find(job, run_dir)
    if resumed:
        job.trainer.resume = str(resumed.path)
    return job


def _launch(cfg: UnitrainConfig, run_dir: Path, launcher: Launcher, config_file: Path, beside: Beside) -> Launch:
    dist, ps = cfg.dist, cfg.dist.ps
    layout = PsLayout.of(ps, dist.nnodes)
    if ps.servers:
        worker_args = ["--ps", cfg.backend.name, str(dist.node_rank), *layout.arguments()]
        options = launcher.ps_options(dist, run_dir)
        command = launcher_command(launcher, options, worker_args, config_file, run_dir, beside)
        log.info("launching %d server(s) and %d trainer(s): %s", ps.servers, ps.trainers, shlex.join(command))
    else:
        ps_args = ["--workerlog", "--ps", cfg.backend.name, "0", "0", "1"]
        command = [sys.executable, *worker_command(config_file, run_dir, "RANK", "LOCAL_RANK", *ps_args)]
    return Launch(
        launcher=launcher,
        command=command,
        follower=_follower(cfg, run_dir, layout),
        workers=layout.trainers[dist.node_rank],
        env={**launcher.ps_env, **network_env(dist, launcher), **beside.env},
        # In the run directory: Paddle's servers write http.log (their gloo key-value store's)
        # into their working directory.
        cwd=run_dir,
        nodes=PsNodeWatch(cfg, run_dir),
    )


def _follower(cfg: UnitrainConfig, run_dir: Path, layout: PsLayout) -> LogFollower:
    """This node's first trainer's log, or its first server's on a node of servers only."""
    trainers = layout.trainer_indices(cfg.dist.node_rank)
    if trainers:
        return LogFollower(run_dir / "workerlog.0", f"[trainer {trainers.start}] ")
    return LogFollower(run_dir / "serverlog.0", f"[server {layout.server_indices(cfg.dist.node_rank).start}] ")


def _check_host(cfg: UnitrainConfig) -> None:
    """dist.ps.hosts names this node's address where its servers listen and trainers are found."""
    dist = cfg.dist
    if not dist.ps.hosts or dist.nnodes == 1:
        return
    mine = dist.ps.hosts[dist.node_rank]
    if mine not in addresses().values():
        raise UnitrainError(
            f"dist.ps.hosts[{dist.node_rank}]={mine!r} is not allowed: it is not an address of this node "
            f"(dist.node_rank={dist.node_rank}); allowed: one of {', '.join(sorted(set(addresses().values())))}"
        )
