"""The one place a job's kind is chosen (``dist.mode``), and a job's config checked in full: the
rules every job follows, its kind's, this machine's, then its backend's."""

from __future__ import annotations

from typing import Dict

from unitrain.config.schema import DistMode, Logger, UnitrainConfig
from unitrain.config.validation import check_config
from unitrain.jobs.collective import CollectiveJob
from unitrain.jobs.kind import JobKind
from unitrain.jobs.machine import check_machine
from unitrain.jobs.parameter_server import ParameterServerJob
from unitrain.tracking import mlflow_runs

KINDS: Dict[DistMode, JobKind] = {DistMode.collective: CollectiveJob(), DistMode.ps: ParameterServerJob()}


def job_kind(cfg: UnitrainConfig) -> JobKind:
    return KINDS[DistMode(cfg.dist.mode)]


def validate(cfg: UnitrainConfig) -> None:
    """Refuse values that are well-typed but meaningless, or that this machine or the backend
    cannot run, in one line naming the key and what is allowed."""
    kind = job_kind(cfg)
    check_config(cfg)
    kind.check(cfg)
    check_machine(cfg, kind.processes(cfg))
    kind.check_machine(cfg)
    kind.check_backend(cfg)
    if Logger.mlflow in cfg.trainer.loggers:
        mlflow_runs.check_reachable()
