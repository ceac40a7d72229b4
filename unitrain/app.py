"""The command line: ``python -m unitrain [overrides]`` and Hydra multirun sweeps."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from unitrain.config.schema import Logger, register_configs
from unitrain.errors import NothingLeftToRun, Refusal, Stopped, UnitrainError
from unitrain.interface.launch import launch_module
from unitrain.interface.modules import available_backends
from unitrain.jobs.kind import JobKind
from unitrain.jobs.select import job_kind, validate
from unitrain.launch import hyperparameter_search, slurm
from unitrain.launch.hydra import discard_refused, hydra_entry
from unitrain.report import failed_jobs
from unitrain.report.training import table, write_report
from unitrain.tasks import task_of
from unitrain.tracking import mlflow_runs
from unitrain.train import objective
from unitrain.train.trainer import out_of_memory

register_configs()


def run(cfg: DictConfig) -> Optional[Dict[str, Any]]:
    """One job: validate, pick the backend, train, print the table. Errors become one line."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        # As an exception, so that every finally clause runs: the launcher and its workers are
        # stopped, metrics are flushed.
        signal.signal(sig, _raise_stopped)
    try:
        for backend in available_backends():  # every start, whatever it runs: what killed jobs left
            launch_module(backend).LAUNCHER.remove_stale()
        kind = job_kind(cfg)
        if kind.nodes_from_slurm:
            slurm.apply(cfg, HydraConfig.get().overrides.task, os.environ)
        validate(cfg)
        # A sweep's jobs run one after another in Hydra's process: each in a fresh one.
        fresh = HydraConfig.get().mode.name == "MULTIRUN" or cfg.trainer.repeats > 1
        if cfg.trainer.repeats == 1:
            summary = _run_tracked(kind, cfg, run_dir, fresh)
        else:
            for i in range(cfg.trainer.repeats):
                (run_dir / f"repeat{i}").mkdir(exist_ok=True)
                summary = _run_tracked(kind, cfg, run_dir / f"repeat{i}", fresh)
    except NothingLeftToRun as err:
        print(f"unitrain: {err}", flush=True)
        return None
    except KeyboardInterrupt:
        print("unitrain: error: interrupted (Ctrl-C); nothing it started is left running", file=sys.stderr, flush=True)
        sys.exit(130)
    except UnitrainError as err:
        if not getattr(err, "already_said", False):  # a job's own process printed it on this console
            print(f"unitrain: error: {err}", file=sys.stderr, flush=True)
        code = getattr(err, "exit_code", 2)
        if isinstance(err, Refusal) and code == 2:
            discard_refused(run_dir)
        if isinstance(err, Stopped):  # a signal stops a search too
            sys.exit(code)
        return _failed_job(code, str(err))
    except MemoryError:
        print(f"unitrain: error: {out_of_memory(cfg)}", file=sys.stderr, flush=True)
        discard_refused(run_dir)
        return _failed_job(2, str(out_of_memory(cfg)))
    if summary is None:
        print(f"node {cfg.dist.node_rank} finished; {kind.summary_holder(cfg)} holds the summary", flush=True)
    elif HydraConfig.get().mode.name == "RUN" and cfg.trainer.repeats > 1:
        print("\n" + write_report([run_dir]) + f"\n\nreport: {run_dir / 'report.html'}", flush=True)
    elif HydraConfig.get().mode.name == "RUN":
        print("\n" + table([run_dir]) + f"\n\nrun directory: {run_dir}", flush=True)
    return summary


def _run_tracked(kind: JobKind, cfg: DictConfig, run_dir: Path, fresh: bool) -> Optional[Dict[str, Any]]:
    """The job, in MLflow when trainer.loggers has it (on the node that holds the summary),
    under its sweep's parent run."""
    if Logger.mlflow not in cfg.trainer.loggers or cfg.dist.node_rank != kind.summary_node(cfg):
        return kind.run(cfg, run_dir, fresh)
    sweep = Path(HydraConfig.get().sweep.dir) if HydraConfig.get().mode.name == "MULTIRUN" else None
    with mlflow_runs.tracked(cfg, run_dir, sweep) as result:
        result["summary"] = kind.run(cfg, run_dir, fresh)
    return result["summary"]


def _raise_stopped(signum, frame) -> None:
    raise Stopped(signum)


def _failed_job(code: int, error: str) -> None:
    """A search goes on past a trial that failed (its objective is the worst value), and a sweep
    past a job that failed: the sweep's end reports the jobs that finished, then names the ones
    that failed and exits with their status. A single job stops with the error's exit status."""
    if hyperparameter_search.searching(HydraConfig.get()):
        return None
    if HydraConfig.get().mode.name == "MULTIRUN":
        failed_jobs.record(Path(HydraConfig.get().sweep.dir), HydraConfig.get(), code, error)
        return None
    sys.exit(code)


@hydra.main(version_base=None, config_path="pkg://unitrain.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> Optional[float]:
    summary = run(cfg)
    if not hyperparameter_search.searching(HydraConfig.get()):
        return None
    result = objective.value(cfg.objective, summary, Path(HydraConfig.get().runtime.output_dir), task_of(cfg).measure)
    print(f"unitrain: objective {cfg.objective.metric} = {result:.6g}", flush=True)
    return result


def main() -> None:
    hydra_entry("unitrain", _hydra_main, validate=validate)
