"""``hydra/sweeper=optuna``: a search, checked and completed before Hydra starts it.

Hydra's Optuna sweeper (hydra-optuna-sweeper, Optuna 2.10) reads what each job returns (the
``objective`` of :mod:`unitrain.train.objective`). Before any trial runs, every dimension of the
search space (``hydra.sweeper.params`` and ``key=interval(...)``/``choice(...)``/``range(...)``
overrides) is checked at its ends and choices as a job would be, so that a key that does not exist
or a range of the wrong type is one line, not a failed trial. What the user leaves unset gets
unitrain's defaults: the study in ``optuna.db`` in the sweep's directory (so that a killed search
resumes: run the same command with the same ``hydra.sweep.dir``), the objective's direction, a
sampler seeded from ``trainer.seed``, one trial at a time (the plugin asks a batch of trials before
it tells any result, and parallel trials time each other).

Resuming keeps the finished trials, runs what is left of ``n_trials``, marks a trial the kill left
running as failed, and seeds the sampler past the trials it has (a sampler restarted from its seed
proposes its first trials again). A study searched over another space is refused.
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from omegaconf import DictConfig, OmegaConf

from unitrain.errors import UnitrainError
from unitrain.train.objective import direction, searching

__all__ = ["completed", "dimensions", "plain", "register_resolvers", "resuming", "searching"]

STORAGE = "optuna.db"
LOCK = ".search.lock"
#: The resolver that numbers a resumed search's job folders after the trials it has.
OFFSET = "unitrain_after"
STUDY = "unitrain"


def register_resolvers() -> None:
    OmegaConf.register_new_resolver(OFFSET, _after, replace=True)


def _after(done: int, *, _root_: DictConfig) -> int:
    """The job's number in the study: Hydra's, after the ``done`` trials of the study it resumes."""
    return int(_root_.hydra.job.num) + int(done)


class SearchRefused(UnitrainError):
    """A search that cannot start as asked."""


@dataclass(frozen=True, kw_only=True)
class Dimension:
    key: str
    text: str  # as written: interval(0.01, 0.1)
    ends: List[Any]  # the values a job is checked at: an interval's ends, every choice


def dimensions(cfg: DictConfig, overrides: List[str]) -> List[Dimension]:
    """The search space: ``hydra.sweeper.params`` and the sweep overrides of the command line."""
    texts = {str(k): str(v) for k, v in (OmegaConf.select(cfg, "hydra.sweeper.params") or {}).items()}
    for override in OverridesParser.create().parse_overrides(overrides):
        if _searched(override):
            texts[override.get_key_element()] = str(override.input_line).partition("=")[2]
    return [Dimension(key=key, text=text, ends=_ends(key, text)) for key, text in texts.items()]


def _ends(key: str, text: str) -> List[Any]:
    try:
        override: Override = OverridesParser.create().parse_override(f"{key}={text}")
    except Exception as err:  # noqa: BLE001 - Hydra's grammar error, in one line
        raise SearchRefused(f"hydra.sweeper.params.{key}={text!r} is not allowed: {str(err).splitlines()[0]}") from None
    value = override.value()
    if isinstance(value, IntervalSweep):
        return [value.start, value.end]
    if isinstance(value, ChoiceSweep):
        return list(value.list)
    if isinstance(value, RangeSweep):
        return list(value.range())[:: max(1, len(list(value.range())) - 1)]
    return [value]


def plain(overrides: List[str]) -> List[str]:
    """The overrides that are not dimensions of the search."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [text for text, o in zip(overrides, parsed) if not _searched(o)]


def _searched(override: Override) -> bool:
    """A dimension of the search on the command line (``hydra.sweeper.params.x=choice(...)`` is the
    sweeper's own setting, given whole)."""
    return override.is_sweep_override() and not override.get_key_element().startswith("hydra.")


def completed(cfg: DictConfig, overrides: List[str]) -> Dict[str, str]:
    """{key: value} unitrain sets for a search: its defaults where the user set nothing, and what
    resuming its study needs (they replace the user's own for the same keys). Refuses a direction
    against the objective's, a study over another search space and one with nothing left to run."""
    sweeper, given = cfg.hydra.sweeper, {o.split("=")[0].lstrip("+~") for o in overrides}
    wanted = direction(cfg.objective, cfg.data.name == "text")
    if "hydra.sweeper.direction" in given and str(_name(sweeper.direction)) != wanted:
        raise SearchRefused(
            f"hydra.sweeper.direction={_name(sweeper.direction)!r} is not allowed with "
            f"objective.metric={cfg.objective.metric}: {wanted} (or leave it unset)"
        )
    storage = sweeper.storage or f"sqlite:///{Path(cfg.hydra.sweep.dir).resolve() / STORAGE}"
    hold(Path(cfg.hydra.sweep.dir).resolve())
    added = {
        "hydra.sweeper.direction": wanted,
        "hydra.sweeper.storage": storage,
        "hydra.sweeper.study_name": sweeper.study_name or STUDY,
    }
    if "hydra.sweeper.n_jobs" not in given:
        added["hydra.sweeper.n_jobs"] = "1"
    _optuna()  # quiet, for the sweeper too: it runs in this process
    study = _existing(storage, added["hydra.sweeper.study_name"])
    done, finished = _resume(study, cfg, overrides) if study is not None else (0, 0)
    if done:
        left = int(sweeper.n_trials) - finished
        if left <= 0:
            raise SearchRefused(
                f"hydra.sweeper.n_trials={sweeper.n_trials} is not allowed: the study in {cfg.hydra.sweep.dir} has "
                f"{finished} finished trials already; allowed: more than {finished} to add trials, or a new "
                "hydra.sweep.dir"
            )
        added["hydra.sweeper.n_trials"] = str(left)
        # Hydra numbers a resumed sweep's jobs from 0 again: their folders would replace the
        # first trials'. Numbered from the study's trial count instead.
        subdir = str(OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["subdir"])
        added["hydra.sweep.subdir"] = subdir.replace("${hydra.job.num}", f"${{{OFFSET}:{done}}}")
    sampler = OmegaConf.select(sweeper, "sampler") or {}
    if "seed" in sampler:
        own = "hydra.sweeper.sampler.seed" in given and sampler.seed is not None
        added["hydra.sweeper.sampler.seed"] = str(int(sampler.seed if own else cfg.trainer.seed) + done)
    return added


#: Sweep directories whose search this process runs (their lock held until it ends).
_HELD: Dict[Path, Any] = {}


def hold(sweep_dir: Path) -> None:
    """This process's claim on the sweep's directory, for as long as it runs: a second search
    started into it meanwhile (whose resume would take the first one's running trial for a
    killed one) is refused in one line."""
    if sweep_dir in _HELD:
        return
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


def _name(value: Any) -> str:
    return getattr(value, "name", value)


def resuming(cfg: DictConfig) -> bool:
    """Whether the sweep's directory holds this search's study, which it continues."""
    storage = cfg.hydra.sweeper.storage or f"sqlite:///{Path(cfg.hydra.sweep.dir).resolve() / STORAGE}"
    path = _sqlite_file(storage)
    return path is not None and path.exists()


def _sqlite_file(storage: str) -> Optional[Path]:
    return Path(storage[len("sqlite:///") :]) if str(storage).startswith("sqlite:///") else None


def _existing(storage: str, name: str) -> Any:
    """The study ``name`` in ``storage``, or None (a new search)."""
    path = _sqlite_file(storage)
    if path is not None and not path.exists():
        return None
    optuna = _optuna()
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:  # no study of that name there
        return None
    except Exception as err:  # noqa: BLE001 - a file that is not a study, a server that does not answer
        raise SearchRefused(
            f"hydra.sweeper.storage={storage!r} is not allowed: {str(err).splitlines()[0]}; allowed: an Optuna "
            "storage (by default optuna.db in the sweep's directory)"
        ) from None


def _optuna() -> Any:
    os.environ.setdefault("SQLALCHEMY_SILENCE_UBER_WARNING", "1")  # Optuna 2.10 on SQLAlchemy 1.4
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return optuna


def _resume(study: Any, cfg: DictConfig, overrides: List[str]) -> Tuple[int, int]:
    """The study's trials and those of them that finished (a trial a kill left running is marked
    failed, and runs again), after checking that it searched the same space."""
    optuna = _optuna()
    from hydra_plugins.hydra_optuna_sweeper._impl import create_optuna_distribution_from_override

    space: Dict[str, Any] = {}
    for dim in dimensions(cfg, overrides):
        override = OverridesParser.create().parse_override(f"{dim.key}={dim.text}")
        if override.is_sweep_override():
            space[dim.key] = create_optuna_distribution_from_override(override)
    for trial in study.get_trials(deepcopy=False):
        if trial.state == optuna.trial.TrialState.RUNNING:
            study._storage.set_trial_state(trial._trial_id, optuna.trial.TrialState.FAIL)
        if trial.distributions and trial.distributions != space:
            raise SearchRefused(
                f"hydra.sweep.dir={cfg.hydra.sweep.dir!r} is not allowed: its study searched "
                f"{_space_text(trial.distributions)}, this search {_space_text(space)}; allowed: the same search "
                "space to resume it, or a new hydra.sweep.dir"
            )
    trials = study.get_trials(deepcopy=False)
    return len(trials), sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials)


def _space_text(space: Dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in sorted(space.items())) + "}"
