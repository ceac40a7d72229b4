"""What a kind of job is: its own config rules, how many processes it starts, how it runs, and
which node holds its summary. ``dist.mode`` picks one (:mod:`unitrain.jobs.select`): data
parallel (``collective``, :mod:`unitrain.jobs.collective`) or parameter servers (``ps``,
:mod:`unitrain.jobs.parameter_server`); nothing else in the core asks which.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Protocol

from unitrain.config.schema import UnitrainConfig

Summary = Optional[Dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class Processes:
    """The training processes a job starts on this node, and the keys that set their number."""

    count: int
    keys: str  # for messages: "dist.nproc_per_node", "dist.ps.servers + dist.ps.trainers"
    #: The one key a refusal of too many names, with its value.
    key: str
    value: int


class JobKind(Protocol):
    #: Whether a job of this kind started in a SLURM allocation takes its nodes from SLURM.
    nodes_from_slurm: bool

    def check(self, cfg: UnitrainConfig) -> None:
        """Raise ConfigError for values this kind of job cannot take (the config alone)."""

    def check_machine(self, cfg: UnitrainConfig) -> None:
        """Raise ConfigError for what this machine lacks for the job: its files, its modules."""

    def check_backend(self, cfg: UnitrainConfig) -> None:
        """The backend's own refusals for this kind of job (its validation module)."""

    def processes(self, cfg: UnitrainConfig) -> Processes:
        """The processes it starts on this node."""

    def run(self, cfg: UnitrainConfig, run_dir: Path, fresh_process: bool) -> Summary:
        """Run this node's share; the job's summary, or None on a node that does not hold it.
        ``fresh_process``: a job of a sweep, which runs in a process of its own."""

    def summary_node(self, cfg: UnitrainConfig) -> int:
        """The rank of the node that writes the job's summary."""

    def summary_holder(self, cfg: UnitrainConfig) -> str:
        """The node that writes the job's summary, in words ("node 0")."""
