"""The command line: ``python -m unitrain [overrides]`` and Hydra multirun sweeps."""

from __future__ import annotations

import signal
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import DictConfig

from unitrain import preflight
from unitrain.compare import table, write_report
from unitrain.config import register_configs, validate
from unitrain.errors import NothingLeftToRun, Stopped, UnitrainError
from unitrain.launch import launch, launch_ps, run_isolated
from unitrain.trainer import train

register_configs()


def run(cfg: DictConfig) -> Optional[Dict[str, Any]]:
    """One job: validate, pick the backend, train, print the table. Errors become one line."""
    run_dir = HydraConfig.get().runtime.output_dir
    for sig in (signal.SIGTERM, signal.SIGHUP):
        # As an exception, so that every finally clause runs: the launcher and its workers are
        # stopped, metrics are flushed.
        signal.signal(sig, _raise_stopped)
    try:
        validate(cfg)
        if cfg.dist.mode == "ps":
            job = launch_ps
        elif cfg.dist.nproc_per_node * cfg.dist.nnodes > 1:
            job = launch
        elif HydraConfig.get().mode.name == "MULTIRUN" or cfg.trainer.repeats > 1:
            job = run_isolated
        else:
            job = train
        if cfg.trainer.repeats == 1:
            summary = job(cfg, run_dir)
        else:
            for i in range(cfg.trainer.repeats):
                (Path(run_dir) / f"repeat{i}").mkdir(exist_ok=True)
                summary = job(cfg, Path(run_dir) / f"repeat{i}")
    except NothingLeftToRun as err:
        print(f"unitrain: {err}", flush=True)
        return None
    except KeyboardInterrupt:
        print("unitrain: error: interrupted (Ctrl-C); nothing it started is left running", file=sys.stderr, flush=True)
        sys.exit(130)
    except UnitrainError as err:
        print(f"unitrain: error: {err}", file=sys.stderr, flush=True)
        sys.exit(getattr(err, "exit_code", 2))
    except MemoryError:
        size = f"data.image_size={cfg.data.image_size}, trainer.batch_size={cfg.trainer.batch_size}, model={cfg.model.name}"
        print(f"unitrain: error: out of memory ({size}); allowed: a smaller image size, batch or model", file=sys.stderr, flush=True)
        sys.exit(2)
    if summary is None:
        print(f"node {cfg.dist.node_rank} finished; node 0 holds the summary", flush=True)
    elif HydraConfig.get().mode.name == "RUN" and cfg.trainer.repeats > 1:
        print("\n" + write_report([run_dir]) + f"\n\nreport: {Path(run_dir) / 'report.html'}", flush=True)
    elif HydraConfig.get().mode.name == "RUN":
        print("\n" + table([run_dir]) + f"\n\nrun directory: {run_dir}", flush=True)
    return summary


def _raise_stopped(signum, frame) -> None:
    raise Stopped(signum)


def group_options() -> Dict[str, List[str]]:
    """The options of each config group, read from the packaged conf/ directory."""
    conf = resources.files("unitrain.conf")
    return {
        group.name: sorted(f.name[: -len(".yaml")] for f in group.iterdir() if f.name.endswith(".yaml"))
        for group in conf.iterdir()
        if group.is_dir() and not group.name.startswith("_")
    }


def check_group_choices(args: List[str]) -> str | None:
    """A one-line message for ``group=option`` overrides naming an option that does not exist.

    Hydra would reject them too, but over a dozen lines with its search path; this names the
    key and the allowed options on one line. Everything else is left to Hydra.
    """
    overrides = [a for a in args if not a.startswith("-") and "=" in a]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException:
        return None  # Hydra reports syntax errors itself.
    options = group_options()
    for override in parsed:
        group = override.key_or_group.lstrip("+~")
        if group not in options or override.package is not None:
            continue
        values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
        for value in values:
            if value is not None and str(value) not in options[group]:
                return f"{group}={value!r} is not allowed: one of {', '.join(options[group])}"
    return None


@hydra.main(version_base=None, config_path="pkg://unitrain.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    run(cfg)


def hydra_entry(prog: str, hydra_main: Callable[[], None], config_name: str = "config") -> None:
    """Reject bad overrides and a run directory holding earlier results in one line, then hand
    the command line to Hydra."""
    args = sys.argv[1:]
    problem = check_group_choices(args)
    if not problem and not preflight.quick_flags(args):
        try:
            preflight.check(args, "unitrain.conf", config_name)
        except preflight.PreflightError as err:
            problem = str(err)
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        sys.exit(2)
    try:
        hydra_main()
    except KeyboardInterrupt:
        print(f"{prog}: error: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        sys.exit(130)


def main() -> None:
    hydra_entry("unitrain", _hydra_main)


