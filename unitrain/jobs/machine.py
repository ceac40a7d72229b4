"""What this machine allows a job, whatever its kind: loader workers, threads and processes for
its cores. A kind's own needs (its files, its modules, its memory) are its ``check_machine``."""

from __future__ import annotations

from unitrain.config.schema import UnitrainConfig
from unitrain.errors import ConfigError
from unitrain.host.threads import available_cores
from unitrain.jobs.kind import Processes

#: Loader worker processes per core beyond which they only contend.
MAX_WORKERS_PER_CORE = 4
#: Training processes (workers, servers, trainers) per core a job may start on a CPU: each is a
#: Python process with its framework loaded (150 MB or more), and past a few per core they
#: measure contention. More than one per core draws a warning at launch.
MAX_PROCESSES_PER_CORE = 8


def check_machine(cfg: UnitrainConfig, processes: Processes) -> None:
    cores = available_cores()
    workers = cfg.data.num_workers
    if workers > MAX_WORKERS_PER_CORE * cores:
        # Each worker is a process with its own copy of the framework's loader state: beyond a
        # few per core they only take memory and contend.
        raise ConfigError(
            "data.num_workers",
            workers,
            f"at most {MAX_WORKERS_PER_CORE * cores} ({MAX_WORKERS_PER_CORE} per core of the {cores} here)",
        )
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
