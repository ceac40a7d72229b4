"""The command line: ``python -m unitrain [overrides]`` and Hydra multirun sweeps."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from unitrain.config.schema import register_configs
from unitrain.config.validation import validate
from unitrain.errors import NothingLeftToRun, Refusal, Stopped, UnitrainError
from unitrain.interface.ps import PsLayout
from unitrain.launch import slurm
from unitrain.launch.hydra import discard_refused, hydra_entry
from unitrain.launch.supervise import launch, launch_ps, run_isolated
from unitrain.report.training import table, write_report
from unitrain.train.trainer import out_of_memory, train

register_configs()


def _choose(cfg: DictConfig) -> Callable[[DictConfig, Any], Optional[Dict[str, Any]]]:
    """One process, data parallel, parameter servers, or (in a sweep) a fresh process per job."""
    if cfg.dist.mode == "ps":
        return launch_ps
    if cfg.dist.nproc_per_node * cfg.dist.nnodes > 1:
        return launch
    if HydraConfig.get().mode.name == "MULTIRUN" or cfg.trainer.repeats > 1:
        return run_isolated
    return train


def run(cfg: DictConfig) -> Optional[Dict[str, Any]]:
    """One job: validate, pick the backend, train, print the table. Errors become one line."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        # As an exception, so that every finally clause runs: the launcher and its workers are
        # stopped, metrics are flushed.
        signal.signal(sig, _raise_stopped)
    try:
        slurm.apply(cfg, HydraConfig.get().overrides.task, os.environ)
        validate(cfg)
        job = _choose(cfg)
        if cfg.trainer.repeats == 1:
            summary = job(cfg, run_dir)
        else:
            for i in range(cfg.trainer.repeats):
                (run_dir / f"repeat{i}").mkdir(exist_ok=True)
                summary = job(cfg, run_dir / f"repeat{i}")
    except NothingLeftToRun as err:
        print(f"unitrain: {err}", flush=True)
        return None
    except KeyboardInterrupt:
        print("unitrain: error: interrupted (Ctrl-C); nothing it started is left running", file=sys.stderr, flush=True)
        sys.exit(130)
    except UnitrainError as err:
        print(f"unitrain: error: {err}", file=sys.stderr, flush=True)
        code = getattr(err, "exit_code", 2)
        if isinstance(err, Refusal) and code == 2:
            discard_refused(run_dir)
        sys.exit(code)
    except MemoryError:
        print(f"unitrain: error: {out_of_memory(cfg)}", file=sys.stderr, flush=True)
        sys.exit(2)
    if summary is None:
        print(f"node {cfg.dist.node_rank} finished; {_summary_holder(cfg)} holds the summary", flush=True)
    elif HydraConfig.get().mode.name == "RUN" and cfg.trainer.repeats > 1:
        print("\n" + write_report([run_dir]) + f"\n\nreport: {run_dir / 'report.html'}", flush=True)
    elif HydraConfig.get().mode.name == "RUN":
        print("\n" + table([run_dir]) + f"\n\nrun directory: {run_dir}", flush=True)
    return summary


def _summary_holder(cfg: DictConfig) -> str:
    """The node whose rank 0 writes the summary: in a parameter-server job, trainer 0's."""
    if cfg.dist.mode != "ps":
        return "node 0"
    layout = PsLayout.of(cfg.dist.ps, cfg.dist.nnodes)
    return f"node {min(n for n in range(cfg.dist.nnodes) if layout.trainers[n])} (trainer 0's)"


def _raise_stopped(signum, frame) -> None:
    raise Stopped(signum)


@hydra.main(version_base=None, config_path="pkg://unitrain.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    run(cfg)


def main() -> None:
    hydra_entry("unitrain", _hydra_main, validate=validate)
