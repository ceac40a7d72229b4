"""What the command line checks before Hydra takes over, so that bad input costs one line.

Hydra reports a wrong key or type over 7-8 lines with exit status 1, and creates (and, for an
existing directory, overwrites) the run directory's ``.hydra/`` before the job sees its config.
So the overrides are composed here first, with Hydra's own compose API against the same
schema, and the run directory is checked while nothing has been written yet.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import BooleanNode, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from unitrain.config.schema import ObjectiveConfig
from unitrain.config.validation import changed_from_schema
from unitrain.errors import UnitrainError
from unitrain.host.atomic import cannot_create_in
from unitrain.host.threads import available_cores
from unitrain.launch import hyperparameter_search
from unitrain.tasks import task_of

#: OmegaConf's words for a value outside an Enum.
_CHOICE = re.compile(r"Invalid value '(.*)', expected one of \[(.*)\]")
#: Hydra's words for an option its config groups lack.
_MISSING_OPTION = re.compile(r"Could not find '(.+)/([^/']+)'")
#: Files whose presence means a directory holds an earlier job's results.
RESULT_FILES = ("metrics.jsonl", "summary.json", "parity.json")


#: Sweep jobs at a time per core (hydra/launcher=joblib): each is a training process.
MAX_JOBS_PER_CORE = 4


class PreflightError(Exception):
    """One line for the user; the command exits 2 and Hydra never starts."""


def _overrides(args: Iterable[str]) -> List[str]:
    return [a for a in args if not a.startswith("-") and "=" in a]


def _single_runs(overrides: List[str]) -> List[List[str]]:
    """Sweep-free override lists that together try every value of every sweep once."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    plain, sweeps = [], []
    for text, override in zip(overrides, parsed):
        if override.is_sweep_override():
            key = override.get_key_element()
            sweeps.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            plain.append(text)
    if not sweeps:
        return [plain]
    firsts = [values[0] for values in sweeps]
    runs = [plain + firsts]
    for i, values in enumerate(sweeps):
        runs += [plain + firsts[:i] + [value] + firsts[i + 1 :] for value in values[1:]]
    return runs


def _allowed_keys(object_type) -> Optional[str]:
    if object_type is not None and dataclasses.is_dataclass(object_type):
        return ", ".join(f.name for f in dataclasses.fields(object_type))
    return None


def one_line(err: BaseException) -> str:
    """Hydra's or OmegaConf's multi-line message, as one line naming the key and what is allowed."""
    cause: Optional[BaseException] = err
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ConfigKeyError) or (isinstance(cause, OmegaConfBaseException) and "not in" in str(cause)):
        key = getattr(cause, "full_key", None) or "?"
        allowed = _allowed_keys(getattr(cause, "object_type", None))
        parent = key.rpartition(".")[0]
        where = f"under {parent}" if parent else "at the top level"
        return (
            f"{key} is not a config key; allowed keys {where}: {allowed}" if allowed else f"{key} is not a config key"
        )
    if isinstance(cause, ValidationError):
        key = getattr(cause, "full_key", None) or "?"
        first = str(cause).splitlines()[0]
        choice = _CHOICE.match(first)
        if choice:  # a value outside a Choice: said as every other refused value is
            value, allowed = choice.groups()
            return f"{key.split('[')[0]}={value!r} is not allowed: one of {allowed}"
        return f"{key}: {first}"
    if isinstance(err, OverrideParseException):
        return f"cannot parse the overrides: {str(err).splitlines()[0]} (see Hydra's override grammar)"
    text = str(cause or err).strip().splitlines()
    missing = _MISSING_OPTION.search(text[0]) if text else None
    listed = [i for i, line in enumerate(text) if line.startswith("Available options")]
    if missing and listed:  # a Hydra group's option (hydra/sweeper=...)
        options = []
        for line in text[listed[0] + 1 :]:
            if not line.startswith("\t"):
                break
            options.append(line.strip())
        group, option = missing.groups()
        return f"{group}={option!r} is not allowed: one of {', '.join(options)}"
    return text[0] if text else type(err).__name__


def _writable_dir(key: str, path: Path) -> None:
    """Whether ``path`` could be created and written, leaving nothing behind: the name Hydra
    gives a default directory is resolved again when it runs, so a directory made here would
    stay empty."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    why = cannot_create_in(existing) if existing.is_dir() else "Not a directory"
    if why:
        raise PreflightError(f"{key}={str(path)!r} is not allowed: {why}; allowed: a directory this user can write")


def _earlier_results(folder: Path) -> Optional[Path]:
    for name in RESULT_FILES:
        if (folder / name).exists():
            return folder / name
    return None


def _resumes_into(resume: Optional[str], run_dir: Path) -> bool:
    """Whether ``trainer.resume`` names a checkpoint inside ``run_dir``: that run continues there."""
    if not resume or resume == "latest":
        return False
    target = Path(resume).resolve()
    return target == run_dir or run_dir in target.parents


def _strays(node: DictConfig, prefix: str = "") -> List[str]:
    """Keys that no schema declares (``+foo=bar``, ``+trainer.stepz=5``): Hydra lets ``+`` add
    them, and nothing would ever read them."""
    found = []
    schema = OmegaConf.get_type(node)
    known = {f.name for f in dataclasses.fields(schema)} if schema and dataclasses.is_dataclass(schema) else None
    for key in node.keys():
        if prefix == "" and key == "hydra":
            continue
        if known is not None and key not in known:
            found.append(f"{prefix}{key}")
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            found += _strays(child, f"{prefix}{key}.")
    return found


def _check_values(run: List[str], cfg: DictConfig, validate: Optional[Callable[[Any], None]]) -> None:
    """What composing accepted but means nothing: keys no schema declares, a boolean given as
    anything but true or false (OmegaConf takes 2 or "yes" as true), then ``validate``."""
    stray = _strays(cfg)
    if stray:
        parent = stray[0].rpartition(".")[0]
        where = f"under {parent}" if parent else "at the top level"
        allowed = _allowed_keys(OmegaConf.get_type(OmegaConf.select(cfg, parent) if parent else cfg))
        allowed = f"; allowed keys {where}: {allowed}" if allowed else ""
        raise PreflightError(f"{stray[0]} is not a config key{allowed}")
    for override in OverridesParser.create().parse_overrides(run):
        key = override.key_or_group.lstrip("+~")
        parent, _, leaf = key.rpartition(".")
        holder = OmegaConf.select(cfg, parent) if parent else cfg
        node = holder._get_node(leaf) if isinstance(holder, DictConfig) and leaf in holder else None
        if isinstance(node, BooleanNode) and not isinstance(override.value(), bool):
            raise PreflightError(f"{key}={override.value()!r} is not allowed: true or false")
    _check_sweep_launcher(cfg)
    if validate is not None:
        try:
            validate(cfg)
        except UnitrainError as err:
            raise PreflightError(str(err)) from None


def _check_sweep_launcher(cfg: DictConfig) -> None:
    """hydra/launcher=joblib's jobs at a time: joblib itself takes 0 with a traceback, and more
    than a few per core only compete (the sweep's table says so of any that ran side by side)."""
    jobs = OmegaConf.select(cfg, "hydra.launcher.n_jobs", default=None)
    most = MAX_JOBS_PER_CORE * available_cores()
    if jobs is not None and (not isinstance(jobs, int) or not (jobs == -1 or 1 <= jobs <= most)):
        raise PreflightError(
            f"hydra.launcher.n_jobs={jobs!r} is not allowed: at most {most} jobs at a time (1 or more), or -1 (one "
            "per core)"
        )


def _composed(config_module: str, config_name: str, runs: List[List[str]], where: str = "") -> List[DictConfig]:
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=config_module, version_base=None):
            return [compose(config_name, overrides=run, return_hydra_config=True) for run in runs]
    except Exception as err:  # noqa: BLE001 - whatever Hydra raises, the user gets one line
        raise PreflightError(where + one_line(err)) from None
    finally:
        GlobalHydra.instance().clear()


def check(
    args: List[str], config_module: str, config_name: str, validate: Optional[Callable[[Any], None]] = None
) -> Dict[str, str]:
    """Compose every override against the schema, check what composing cannot (keys nothing
    declares, booleans, ``validate``'s value checks), then the run (or sweep) directory. A search
    (hydra/sweeper=optuna) is checked at every end of its space; returns the overrides it adds."""
    overrides = _overrides(args)
    multirun = "-m" in args or "--multirun" in args
    _check_no_sweeper_params(overrides)
    try:
        if multirun and config_name == "config":
            (first,) = _composed(config_module, config_name, [hyperparameter_search.plain(overrides)])
            if hyperparameter_search.searching(first.hydra):
                return _check_search(first, overrides, config_module, validate)
        runs = _single_runs(overrides)
    except OverrideParseException as err:
        raise PreflightError(one_line(err)) from None
    except UnitrainError as err:
        raise PreflightError(str(err)) from None
    for run, cfg in zip(runs, _composed(config_module, config_name, runs)):
        _check_values(run, cfg, validate)
        if config_name == "config":
            _check_objective_unread(cfg)
        if multirun:
            _check_sweep_dir(cfg)
        else:
            _check_run_dir(cfg)
    return {}


def _check_no_sweeper_params(overrides: List[str]) -> None:
    """``hydra.sweeper.params.<key>=...`` on the command line: the key's dots would nest it."""
    given = [o for o in overrides if o.lstrip("+~").startswith("hydra.sweeper.params.")]
    if given:
        key, _, value = given[0].lstrip("+~").partition("=")
        dimension = f"{key[len('hydra.sweeper.params.') :]}={value.strip(chr(39))}"
        raise PreflightError(
            f"{key}={value} is not allowed on the command line (the key's dots would nest it); allowed: "
            f"{dimension} on the command line, or hydra.sweeper.params in an experiment's YAML"
        )


def _check_sweep_dir(cfg: DictConfig) -> None:
    """A sweep's directory: writable, and holding no earlier sweep's results."""
    sweep_dir = Path(OmegaConf.select(cfg, "hydra.sweep.dir")).resolve()
    _writable_dir("hydra.sweep.dir", sweep_dir)
    taken = [p for p in sweep_dir.glob("*/") if _earlier_results(p)]
    if taken:
        raise PreflightError(
            f"hydra.sweep.dir={str(sweep_dir)!r} is not allowed: it holds an earlier sweep's results "
            f"({taken[0].name}/); "
            "allowed: a new directory (leave hydra.sweep.dir unset for a fresh one)"
        )


def _check_run_dir(cfg: DictConfig) -> None:
    """A run's directory: writable, and holding no earlier run's results unless the run resumes into it."""
    run_dir = Path(OmegaConf.select(cfg, "hydra.run.dir")).resolve()
    _writable_dir("hydra.run.dir", run_dir)
    earlier = _earlier_results(run_dir)
    if earlier and not _resumes_into(OmegaConf.select(cfg, "trainer.resume"), run_dir):
        raise PreflightError(
            f"hydra.run.dir={str(run_dir)!r} is not allowed: it holds an earlier run's results ({earlier.name}), "
            "which "
            "this run would replace; allowed: a new directory, or trainer.resume=<that run dir> to continue it"
        )


def _check_objective_unread(cfg: DictConfig) -> None:
    """objective.* as the schema has it: only a search (hydra/sweeper=optuna) reads a job's
    objective; a run or a grid would ignore it."""
    changed = changed_from_schema(cfg.objective, ObjectiveConfig)
    if changed:
        key, value = changed
        raise PreflightError(
            f"objective.{key}={value!r} is not allowed without a search: only hydra/sweeper=optuna reads it; "
            "allowed: unset, or a search (-m hydra/sweeper=optuna with a dimension)"
        )


def _check_search(
    first: DictConfig, overrides: List[str], config_module: str, validate: Optional[Callable[[Any], None]]
) -> Dict[str, str]:
    """Every dimension of the search at its ends and choices, as a job would be checked; the
    sweep's directory; then what unitrain adds (:func:`unitrain.launch.hyperparameter_search.completed`)."""
    hyperparameter_search.quiet_optuna()  # installed (the sweeps extra), said before anything else is checked
    dimensions = hyperparameter_search.dimensions(first, overrides)
    if not dimensions:
        raise PreflightError(
            "hydra/sweeper=optuna has nothing to search: allowed: hydra.sweeper.params.<key>=interval(a,b), "
            "choice(...) or range(...), or key=interval(a,b) on the command line"
        )
    base = hyperparameter_search.plain(overrides)
    _check_values(base, first, validate)
    for dim in dimensions:
        where = f"hydra.sweeper.params.{dim.key}={dim.text}: "
        runs = [[*base, f"{dim.key}={value}"] for value in dim.ends]
        for run, cfg in zip(runs, _composed(config_module, "config", runs, where)):
            try:
                _check_values(run, cfg, validate)
            except PreflightError as err:
                raise PreflightError(where + str(err)) from None
    if first.trainer.repeats != 1:
        raise PreflightError(f"trainer.repeats={first.trainer.repeats} is not allowed in a search: 1 (one run a trial)")
    if not task_of(first).has_held_out(first.data):
        raise PreflightError(
            f"data={first.data.name} without a held-out set is not allowed in a search: its objective is held-out "
            "top-1; allowed: data.val_samples=N (synthetic data), data.val_path (image folders), or fashion_mnist"
        )
    sweep_dir = Path(OmegaConf.select(first, "hydra.sweep.dir")).resolve()
    _writable_dir("hydra.sweep.dir", sweep_dir)
    taken = [p for p in sweep_dir.glob("*/") if _earlier_results(p)]
    if taken and not hyperparameter_search.resuming(first):
        raise PreflightError(
            f"hydra.sweep.dir={str(sweep_dir)!r} is not allowed: it holds an earlier sweep's results "
            f"({taken[0].name}/) and no study to resume; allowed: a new directory"
        )
    try:
        # The directory as composed now: Hydra would read ${now:...} again, a second later.
        return {"hydra.sweep.dir": str(sweep_dir), **hyperparameter_search.completed(first, overrides)}
    except UnitrainError as err:
        raise PreflightError(str(err)) from None


def quick_flags(args: List[str]) -> bool:
    """Hydra's informational flags (--help, --cfg, --info...) compose nothing and write nothing."""
    return any(
        a in ("--help", "-h", "--hydra-help", "--version", "--info", "-i", "--cfg", "-c", "--shell-completion", "-sc")
        for a in args
    )
