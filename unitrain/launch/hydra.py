"""Every Hydra command's way in: overrides checked in one line before Hydra composes anything."""

from __future__ import annotations

import re
import shutil
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from unitrain.launch import preflight
from unitrain.train.objective import OPTUNA


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


#: Hydra's flags that take no value: a bare word after any other flag is that flag's value.
_VALUELESS_FLAGS = ("-m", "--multirun", "-h", "--help", "--hydra-help", "--version", "--resolve")


def bare_argument(args: List[str]) -> Optional[str]:
    """A word that is neither an override nor a flag's value (``python -m unitrain foo``), in
    one line; Hydra would answer with its grammar's four."""
    for previous, arg in zip([None, *args], args):
        if arg.startswith("-") or "=" in arg:
            continue
        if previous is None or not previous.startswith("-") or previous in _VALUELESS_FLAGS:
            return (
                f"{arg!r} is not allowed: overrides are key=value (trainer.steps=10) or group=option (backend=paddle)"
            )
    return None


def register_sweeper() -> None:
    """hydra/sweeper=optuna (unitrain's sweeper, in Hydra's hydra_plugins namespace) known to Hydra.
    Hydra finds it by listing the hydra_plugins namespace, which an editable install's finder
    (pip install -e) does not list: loaded here by the name its config gives (as Hydra loads a
    ``_target_``; unitrain imports nothing from hydra_plugins) and registered by its own method, it
    is found either way; after Hydra's own scan, so that it replaces another plugin's hydra/sweeper=optuna."""
    from hydra.core.plugins import Plugins
    from hydra.utils import get_class

    Plugins.instance()  # scans hydra_plugins
    get_class(OPTUNA).register()


def refusal(
    args: List[str], config_name: str = "config", validate: Optional[Callable[[Any], None]] = None
) -> Optional[str]:
    """Why the command line ``args`` is refused before anything is written, in one line, or None."""
    return prepared(args, config_name, validate)[0]


def prepared(
    args: List[str], config_name: str = "config", validate: Optional[Callable[[Any], None]] = None
) -> Tuple[Optional[str], Dict[str, str]]:
    """The refusal of ``args`` (or None), and the overrides unitrain adds (a search's defaults)."""
    register_sweeper()
    problem = bare_argument(args) or check_group_choices(args)
    if problem or preflight.quick_flags(args):
        return problem, {}
    try:
        return None, preflight.check(args, "unitrain.conf", config_name, validate)
    except preflight.PreflightError as err:
        return str(err), {}


def hydra_entry(
    prog: str,
    hydra_main: Callable[[], None],
    config_name: str = "config",
    validate: Optional[Callable[[Any], None]] = None,
) -> None:
    """Reject bad overrides, values ``validate`` refuses and a run directory holding earlier
    results in one line, before anything is written; then hand the command line to Hydra."""
    problem, added = prepared(sys.argv[1:], config_name, validate)
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        sys.exit(2)
    if added:  # they replace the user's values for the same keys
        kept = [a for a in sys.argv[1:] if a.split("=")[0].lstrip("+~") not in added]
        sys.argv[1:] = kept + [f"{key}={value}" for key, value in added.items()]
    try:
        hydra_main()
    except KeyboardInterrupt:
        print(f"{prog}: error: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        sys.exit(130)


#: What a run directory holds before the job has produced anything: Hydra's record and logs, the
#: resolved config handed to the workers, the launcher's and the workers' logs and status files.
_SCAFFOLDING = (".hydra", ".workers", "worker_config.yaml", "launcher.log", "http.log")
#: A tracked run's record and, when the run is not part of a sweep, its own MLflow store (whose
#: run the refusal deleted).
_TRACKING = ("mlflow.json", "mlflow.db", "mlartifacts")


def _scaffolding(p: Path) -> bool:
    """Written by starting a job (Hydra, the launchers, an empty metrics file), not by running it."""
    return (
        p.name in _SCAFFOLDING + _TRACKING
        or p.suffix == ".log"
        or p.name.startswith(
            ("workerlog.", "serverlog.", "envlog.", "backup_env.")
        )  # Paddle's launcher writes the last two
        # A refused job's records are not results: results a run keeps are its checkpoints'
        # (a folder that is not scaffolding, so it keeps the directory and everything in it).
        or p.name == "metrics.jsonl"
        # A parameter server's own record (its peak memory), written whenever it stops serving.
        or (p.name == "ps" and p.is_dir() and all(f.name.startswith("server") for f in p.iterdir()))
    )


def discard_refused(run_dir: Path) -> None:
    """A refused job's directory, when it holds nothing but what starting it wrote: a refusal
    leaves nothing behind. (Preflight refuses most values before Hydra writes anything; what
    only a framework can decide is refused after.)"""
    for folder in [run_dir, run_dir.parent] if HydraConfig.get().mode.name == "MULTIRUN" else [run_dir]:
        entries = list(folder.iterdir()) if folder.is_dir() else []
        ours = [p for p in entries if _scaffolding(p)]
        if folder == run_dir.parent:
            ours = [p for p in entries if p.name == "multirun.yaml"]  # the sweep's own record
        if len(ours) != len(entries):
            return
        for p in ours:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        folder.rmdir()
    _discard_empty_default_parents(run_dir)


def _discard_empty_default_parents(run_dir: Path) -> None:
    """The default layout's folders Hydra made for this run alone (``runs/<date>/``, ``runs/``;
    a sweep's ``multirun/<date>/``), once empty: only folders named as that layout names them."""
    for folder in list(run_dir.parents)[:3]:
        if not folder.exists():
            continue  # the sweep's folder, gone already
        dated = re.fullmatch(r"\d{4}-\d\d-\d\d", folder.name)
        if not (dated or folder.name in ("runs", "multirun")) or any(folder.iterdir()):
            return
        folder.rmdir()
        if not dated:
            return
