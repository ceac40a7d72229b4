"""What this machine allows a job, whatever its kind: loader workers, threads and processes for
its cores. A kind's own needs (its files, its modules, its memory) are its ``check_machine``."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Optional, Set

from unitrain.config.schema import UnitrainConfig
from unitrain.config.validation import SHARED_DIR_ALLOWED
from unitrain.errors import ConfigError
from unitrain.host.network import addresses
from unitrain.host.ports import port_in_use
from unitrain.host.threads import available_cores, check_loader_workers
from unitrain.interface.launch import busy_port_error
from unitrain.jobs.kind import Processes

#: Training processes (workers, servers, trainers) per core a job may start on a CPU: each is a
#: Python process with its framework loaded (150 MB or more), and past a few per core they
#: measure contention. More than one per core draws a warning at launch.
MAX_PROCESSES_PER_CORE = 8


def check_machine(cfg: UnitrainConfig, processes: Processes) -> None:
    _check_cores(cfg, processes)
    _check_master(cfg)
    _check_shared_dir(cfg.dist.shared_dir)


def _check_shared_dir(shared: Optional[str]) -> None:
    """dist.shared_dir exists here, and holds no other job's checkpoints, which this job's would
    overwrite or prune."""
    if not shared:
        return
    if not os.path.isdir(shared):
        raise ConfigError("dist.shared_dir", shared, SHARED_DIR_ALLOWED)
    if any((Path(shared) / "checkpoints").glob("step*")):
        raise ConfigError(
            "dist.shared_dir",
            shared,
            "a directory that holds no checkpoints yet (one per job: resume another job's with trainer.resume)",
        )


def _check_cores(cfg: UnitrainConfig, processes: Processes) -> None:
    check_loader_workers(cfg.data.num_workers)
    cores = available_cores()
    threads = cfg.trainer.threads
    if threads is not None and threads > cores:
        # Oversubscribed threads measure contention, not the framework (1000 threads ran ~0.1%
        # of the speed of 2 here).
        raise ConfigError(
            "trainer.threads", threads, f"at most {cores}, the cores this process may use (or unset: all of them)"
        )
    if cfg.backend.device != "gpu" and processes.count > MAX_PROCESSES_PER_CORE * cores:
        raise ConfigError(
            processes.key,
            processes.value,
            f"at most {MAX_PROCESSES_PER_CORE * cores} processes on a CPU of {cores} cores ({processes.count} asked "
            "for)",
        )


def _resolved(host: str) -> Set[str]:
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)}
    except OSError as err:
        raise ConfigError(
            "dist.master_addr",
            host,
            f"it does not resolve ({err.strerror or err}); allowed: an address or host name of node 0 that every "
            "node can reach",
        ) from None


def _check_master(cfg: UnitrainConfig) -> None:
    """Over several nodes: node 0's address resolves, and on node 0 it is this host's, where the
    job's store listens; node 0's master port is free (its launcher listens there)."""
    dist = cfg.dist
    if dist.nnodes > 1:
        resolved = _resolved(dist.master_addr)
        own = set(addresses().values())
        if dist.node_rank == 0 and not any(a in own or a.startswith("127.") for a in resolved):
            raise ConfigError(
                "dist.master_addr",
                dist.master_addr,
                f"an address of this host on node 0 (dist.node_rank=0), where the job's store listens; this host's: "
                f"{', '.join(sorted(own))}",
            )
    if dist.master_port is not None and dist.node_rank == 0:
        why = port_in_use(dist.master_port)
        if why:
            raise busy_port_error(dist.master_port, why)
