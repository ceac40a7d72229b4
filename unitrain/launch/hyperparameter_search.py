"""``hydra/sweeper=optuna``: a search, checked and completed before Hydra starts it.

unitrain's Optuna sweeper (:mod:`unitrain.launch.optuna_sweeper`) reads what each job returns (the
``objective`` of :mod:`unitrain.train.objective`). Before any trial runs, every dimension of the
search space (``hydra.sweeper.params`` and ``key=interval(...)``/``choice(...)``/``range(...)``
overrides) is checked at its ends and choices as a job would be, so that a key that does not exist
or a range of the wrong type is one line, not a failed trial; so is the space itself (reversed
ends, a tag other than ``log``, a grid sampler over a continuous interval), the trial count and
the storage. What the user leaves unset gets unitrain's defaults: the study in ``optuna.db`` in
the sweep's directory (so that a killed search resumes: run the same command with the same
``hydra.sweep.dir``), the objective's direction, a sampler seeded from ``trainer.seed``.

Resuming keeps the finished trials, runs what is left of ``n_trials``, marks a trial the kill left
running as failed, and seeds the sampler past the trials it has (a sampler restarted from its seed
proposes its first trials again); the sweeper numbers each job's folder after its trial. A study
searched over another space is refused.
"""

from __future__ import annotations

import fcntl
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep, Transformer
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from unitrain.errors import UnitrainError
from unitrain.tasks.registry import task_of
from unitrain.train.objective import direction, searching

__all__ = ["completed", "dimensions", "distribution", "grid", "plain", "resuming", "searching", "space"]

STORAGE = "optuna.db"
LOCK = ".search.lock"
STUDY = "unitrain"
#: Hydra's tags that mean something to a search: ``tag(log, interval(a, b))``, a log scale.
TAGS = ("log",)


class SearchRefused(UnitrainError):
    """A search that cannot start as asked."""


@dataclass(frozen=True, kw_only=True)
class Dimension:
    key: str
    text: str  # as written: interval(0.01, 0.1)
    ends: List[Any]  # the values a job is checked at: an interval's ends, every choice

    def distribution(self) -> Any:
        return distribution(self.key, self.text)


def dimensions(cfg: DictConfig, overrides: List[str]) -> List[Dimension]:
    """The search space: ``hydra.sweeper.params`` and the sweep overrides of the command line."""
    texts = {str(k): str(v) for k, v in (OmegaConf.select(cfg, "hydra.sweeper.params") or {}).items()}
    # The command line's last word on a key wins, as for any override: a plain value after a
    # dimension (or over an experiment's) fixes the key for this command, a dimension after a value
    # searches it.
    for override in OverridesParser.create().parse_overrides(overrides):
        if _searched(override):
            texts[override.get_key_element()] = str(override.input_line).partition("=")[2]
        else:
            texts.pop(override.get_key_element(), None)
    return [Dimension(key=key, text=text, ends=_ends(key, text)) for key, text in texts.items()]


def _parsed(key: str, text: str) -> Override:
    try:
        return OverridesParser.create().parse_override(f"{key}={text}")
    except Exception as err:  # noqa: BLE001 - Hydra's grammar error, in one line
        raise SearchRefused(f"hydra.sweeper.params.{key}={text!r} is not allowed: {str(err).splitlines()[0]}") from None


def _ends(key: str, text: str) -> List[Any]:
    value = _parsed(key, text).value()
    if isinstance(value, IntervalSweep):
        return [value.start, value.end]
    if isinstance(value, ChoiceSweep):
        return list(value.list)
    if isinstance(value, RangeSweep):
        return list(value.range())[:: max(1, len(list(value.range())) - 1)]
    return [value]


def plain(overrides: List[str]) -> List[str]:
    """The overrides that are not dimensions of the search (nor values a later dimension replaces)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    searched_after = [{o.get_key_element() for o in parsed[i + 1 :] if _searched(o)} for i in range(len(parsed))]
    return [
        text
        for text, o, later in zip(overrides, parsed, searched_after)
        if not (_searched(o) or o.get_key_element() in later)
    ]


def _searched(override: Override) -> bool:
    """A dimension of the search on the command line (``hydra.sweeper.params.x=choice(...)`` is the
    sweeper's own setting, given whole)."""
    return override.is_sweep_override() and not override.get_key_element().startswith("hydra.")


def distribution(key: str, text: str) -> Any:
    """The Optuna distribution Hydra's sweep syntax ``text`` names (None for a plain value), as
    Hydra's Optuna sweeper builds it: an interval is continuous (Hydra's grammar reads its ends as
    floats; int only where both ends are ints), on a log scale with ``tag(log, ...)``; a choice is
    categorical; a range is stepped over exactly the values Hydra's ``range`` gives (its stop
    excluded, as preflight checks its ends; hydra-optuna-sweeper's included the stop)."""
    value, optuna = _parsed(key, text).value(), quiet_optuna()
    if not isinstance(value, (IntervalSweep, ChoiceSweep, RangeSweep)):
        return None
    tags = set(value.tags or ())
    unknown = sorted(tags - set(TAGS)) or (sorted(tags) if not isinstance(value, IntervalSweep) else [])
    if unknown:
        raise _bad(
            key, text, f"tag {unknown[0]!r} means nothing to the search", "tag(log, interval(a, b)), a log scale"
        )
    d = optuna.distributions
    try:
        if isinstance(value, IntervalSweep):
            return _interval(key, text, value)
        if isinstance(value, RangeSweep) and not value.shuffle:
            return _range(key, text, value)
        choices = list(_parsed(key, text).sweep_iterator(transformer=Transformer.encode))
        return d.CategoricalDistribution(choices)
    except ValueError as err:  # Optuna's words for a space it cannot search
        raise _bad(key, text, str(err).splitlines()[0], "interval(a, b), choice(...) or range(...)") from None


def _interval(key: str, text: str, value: IntervalSweep) -> Any:
    d = quiet_optuna().distributions
    if value.start > value.end:
        raise _bad(
            key, text, f"its ends are reversed ({value.start} > {value.end})", "interval(low, high), low <= high"
        )
    log = "log" in (value.tags or ())
    if isinstance(value.start, int) and isinstance(value.end, int):
        return d.IntDistribution(value.start, value.end, log=log)
    return d.FloatDistribution(float(value.start), float(value.end), log=log)


def _range(key: str, text: str, value: RangeSweep) -> Any:
    d, values = quiet_optuna().distributions, list(value.range())
    if not values:
        raise _bad(key, text, "it has no values", "range(start, stop[, step]) with start before stop")
    if all(isinstance(v, int) for v in (*values, value.step)):
        return d.IntDistribution(values[0], values[-1], step=int(value.step))
    return d.FloatDistribution(_digits(values[0]), _digits(values[-1]), step=_digits(value.step))


def _digits(x: float) -> float:
    """12 digits: a float range's 0.1 + 2 * 0.1 is 0.30000000000000004, a value nobody wrote (and
    off Optuna's step grid)."""
    return float(f"{x:.12g}")


def _bad(key: str, text: str, problem: str, allowed: str) -> SearchRefused:
    return SearchRefused(f"{key}={text} is not allowed: {problem}; allowed: {allowed}")


def space(dims: List[Dimension]) -> Dict[str, Any]:
    """{key: Optuna distribution} of the dimensions that are searched (not plain values)."""
    built = {dim.key: dim.distribution() for dim in dims}
    return {key: dist for key, dist in built.items() if dist is not None}


def grid(searched: Dict[str, Any]) -> Dict[str, List[Any]]:
    """Every value of each dimension, for Optuna's GridSampler; a continuous interval has no grid."""
    d, values = quiet_optuna().distributions, {}
    for key, dist in searched.items():
        if isinstance(dist, d.CategoricalDistribution):
            values[key] = list(dist.choices)
        elif dist.step is not None and not dist.log:
            count = int(round((dist.high - dist.low) / dist.step)) + 1
            values[key] = [type(dist.low)(_digits(dist.low + i * dist.step)) for i in range(count)]
        else:
            raise SearchRefused(
                f"hydra.sweeper.sampler._target_=optuna.samplers.GridSampler is not allowed over {key} ({dist!r}): a "
                "grid needs every value; allowed: choice(...) or range(...) dimensions, or another sampler "
                "(hydra/sweeper/sampler=tpe|random)"
            )
    return values


def is_grid(sampler: Any) -> bool:
    return str(OmegaConf.select(sampler, "_target_", default="")).endswith("GridSampler") if sampler else False


def sampler(settings: Any, searched: Dict[str, Any]) -> Any:
    """The Optuna sampler ``hydra.sweeper.sampler`` names; a grid sampler over every value of the
    space (its ``_target_`` given on the command line over another sampler's keys too)."""
    optuna = quiet_optuna()
    given = {k: v for k, v in OmegaConf.to_container(settings, resolve=True).items() if k != "_partial_"}
    try:
        if is_grid(settings):
            return optuna.samplers.GridSampler(grid(searched), seed=given.get("seed"))
        return instantiate(given)
    except SearchRefused:
        raise
    except Exception as err:  # noqa: BLE001 - a class that does not exist, an argument it does not take
        raise SearchRefused(
            f"hydra.sweeper.sampler._target_={given.get('_target_')!r} is not allowed: {_one_line(err)}; allowed: "
            "hydra/sweeper/sampler=tpe|random|cmaes|nsgaii|grid, or an optuna.samplers class and its arguments"
        ) from None


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    # Hydra's instantiate ends its message with advice about its own environment variable.
    return (lines[-1] if lines else type(err).__name__).split(", set env var HYDRA_FULL_ERROR")[0]


def completed(cfg: DictConfig, overrides: List[str]) -> Dict[str, str]:
    """{key: value} unitrain sets for a search: its defaults where the user set nothing, and what
    resuming its study needs (they replace the user's own for the same keys). Refuses a direction
    against the objective's, a space, trial count, sampler or storage Optuna cannot take, a study
    over another search space and one with nothing left to run; a refusal leaves nothing behind."""
    sweeper, given = cfg.hydra.sweeper, {o.split("=")[0].lstrip("+~") for o in overrides}
    wanted = direction(cfg.objective, task_of(cfg).measure)
    if "hydra.sweeper.direction" in given and str(_name(sweeper.direction)) != wanted:
        raise SearchRefused(
            f"hydra.sweeper.direction={_name(sweeper.direction)!r} is not allowed with "
            f"objective.metric={cfg.objective.metric}: {wanted} (or leave it unset)"
        )
    for key in ("n_trials", "n_jobs"):
        if int(sweeper[key]) < 1:
            raise SearchRefused(f"hydra.sweeper.{key}={sweeper[key]} is not allowed: a whole number >= 1")
    searched = space(dimensions(cfg, overrides))
    sampler(sweeper.sampler, searched)
    storage = _storage(cfg)
    _check_storage(storage)
    added = {
        "hydra.sweeper.direction": wanted,
        "hydra.sweeper.storage": storage,
        "hydra.sweeper.study_name": sweeper.study_name or STUDY,
    }
    sweep_dir = Path(cfg.hydra.sweep.dir).resolve()
    made = hold(sweep_dir)
    try:
        study = _existing(storage, added["hydra.sweeper.study_name"])
        done, finished = _resume(study, cfg, searched) if study is not None else (0, 0)
        if done:
            added["hydra.sweeper.n_trials"] = str(_left(cfg, finished))
    except SearchRefused:
        release(sweep_dir, made)
        raise
    settings = OmegaConf.select(sweeper, "sampler") or {}
    if "seed" in settings:
        own = "hydra.sweeper.sampler.seed" in given and settings.seed is not None
        added["hydra.sweeper.sampler.seed"] = str(int(settings.seed if own else cfg.trainer.seed) + done)
    return added


def _left(cfg: DictConfig, finished: int) -> int:
    """The trials a resumed search runs: what its study lacks of ``n_trials`` finished ones."""
    left = int(cfg.hydra.sweeper.n_trials) - finished
    if left <= 0:
        raise SearchRefused(
            f"hydra.sweeper.n_trials={cfg.hydra.sweeper.n_trials} is not allowed: the study in {cfg.hydra.sweep.dir} "
            f"has {finished} finished trials already; allowed: more than {finished} to add trials, or a new "
            "hydra.sweep.dir"
        )
    return left


def _check_storage(storage: str) -> None:
    """A URL SQLAlchemy reads, whose database driver is installed (checked without connecting, so
    before the sweep's directory is made)."""
    from sqlalchemy.engine import make_url

    try:
        dialect = make_url(storage).get_dialect()
        (getattr(dialect, "import_dbapi", None) or dialect.dbapi)()
    except Exception as err:  # noqa: BLE001 - SQLAlchemy's words for a URL it cannot use
        raise SearchRefused(
            f"hydra.sweeper.storage={storage!r} is not allowed: {str(err).splitlines()[0]}; allowed: an Optuna "
            "storage URL (sqlite:///<file>, postgresql://..., mysql://...), by default optuna.db in the sweep's "
            "directory"
        ) from None


#: Sweep directories whose search this process runs (their lock held until it ends).
_HELD: Dict[Path, Any] = {}


def hold(sweep_dir: Path) -> List[Path]:
    """This process's claim on the sweep's directory, for as long as it runs: a second search
    started into it meanwhile (whose resume would take the first one's running trial for a
    killed one) is refused in one line. Returns the folders it made and the lock, if new."""
    if sweep_dir in _HELD:
        return []
    made = [p for p in [sweep_dir, *sweep_dir.parents] if not p.exists()]
    made += [] if (sweep_dir / LOCK).exists() else [sweep_dir / LOCK]
    sweep_dir.mkdir(parents=True, exist_ok=True)
    handle = open(sweep_dir / LOCK, "a+")  # noqa: SIM115 - held open until the process ends
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise SearchRefused(
            f"hydra.sweep.dir={str(sweep_dir)!r} is not allowed: another search is running in it; allowed: wait "
            "for it to end (then this command resumes its study), or a new hydra.sweep.dir"
        ) from None
    _HELD[sweep_dir] = handle
    return made


def release(sweep_dir: Path, made: List[Path]) -> None:
    """A refused search's claim given up: what :func:`hold` made removed (the lock, then the
    folders, each only if empty), so that the refusal leaves nothing behind."""
    handle = _HELD.pop(sweep_dir, None)
    if handle is not None:
        handle.close()
    for path in sorted(made, key=lambda p: len(p.parts), reverse=True):
        if path.is_file():
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def _name(value: Any) -> str:
    return getattr(value, "name", value)


def resuming(cfg: DictConfig) -> bool:
    """Whether the sweep's directory holds this search's study, which it continues."""
    path = _sqlite_file(_storage(cfg))
    return path is not None and path.exists()


def _storage(cfg: DictConfig) -> str:
    """The study's storage: ``hydra.sweeper.storage``, else optuna.db in the sweep's directory."""
    return cfg.hydra.sweeper.storage or f"sqlite:///{Path(cfg.hydra.sweep.dir).resolve() / STORAGE}"


def _sqlite_file(storage: str) -> Optional[Path]:
    return Path(storage[len("sqlite:///") :]) if str(storage).startswith("sqlite:///") else None


def _existing(storage: str, name: str) -> Any:
    """The study ``name`` in ``storage``, or None (a new search)."""
    path = _sqlite_file(storage)
    if path is not None and not path.exists():
        return None
    optuna = quiet_optuna()
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:  # no study of that name there
        return None
    except Exception as err:  # noqa: BLE001 - a file that is not a study, a server that does not answer
        raise SearchRefused(
            f"hydra.sweeper.storage={storage!r} is not allowed: {str(err).splitlines()[0]}; allowed: an Optuna "
            "storage (by default optuna.db in the sweep's directory)"
        ) from None


def quiet_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise SearchRefused(
            "hydra/sweeper=optuna needs Optuna, which is not installed; install it with: pip install 'unitrain[sweeps]'"
        ) from None

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return optuna


def _resume(study: Any, cfg: DictConfig, searched: Dict[str, Any]) -> Tuple[int, int]:
    """The study's trials and those of them that finished (a trial a kill left running is marked
    failed, and runs again), after checking that it searched the same space."""
    optuna = quiet_optuna()
    for trial in study.get_trials(deepcopy=False):
        if trial.distributions and trial.distributions != searched:
            raise SearchRefused(
                f"hydra.sweep.dir={cfg.hydra.sweep.dir!r} is not allowed: its study searched "
                f"{_space_text(trial.distributions)}, this search {_space_text(searched)}; allowed: the same search "
                "space to resume it, or a new hydra.sweep.dir"
            )
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    trials = study.get_trials(deepcopy=False)
    return len(trials), sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials)


def _space_text(space: Dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in sorted(space.items())) + "}"
