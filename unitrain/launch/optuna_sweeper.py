"""``hydra/sweeper=optuna``'s trials, on Optuna's ask-and-tell API.

The sweeper Hydra instantiates (``hydra_plugins.unitrain_sweeper``) hands the search to
:class:`AskAndTell`: the study is created or loaded from its storage, each trial asked with the
space's fixed distributions (:func:`unitrain.launch.hyperparameter_search.space`), its job launched through
Hydra's launcher in a folder numbered after the trial (a resumed study's jobs come after its old
ones), and the value the job returned told; a job that raised or returned no number is a failed
trial. The space, sampler, storage and trial count were checked before Hydra started
(:func:`unitrain.launch.hyperparameter_search.completed`), so what is refused here is refused there first.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from unitrain.launch import hyperparameter_search

log = logging.getLogger(__name__)
#: What the sweep directory gets at the end, as Hydra's own Optuna sweeper writes it.
RESULTS = "optimization_results.yaml"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """``hydra.sweeper``'s keys (hydra_plugins.unitrain_sweeper.OptunaSweeperConf)."""

    sampler: Any
    direction: str
    storage: Optional[str]
    study_name: Optional[str]
    n_trials: int
    n_jobs: int
    max_failure_rate: float
    params: Optional[Any]


class AskAndTell:
    def __init__(self, *, settings: Settings, config: DictConfig, launcher: Any) -> None:
        self.settings, self.config, self.launcher = settings, config, launcher

    @classmethod
    def setup(
        cls, settings: Dict[str, Any], *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> "AskAndTell":
        launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )
        return cls(settings=Settings(**settings), config=config, launcher=launcher)

    def sweep(self, arguments: List[str]) -> None:
        """``n_trials`` trials, ``n_jobs`` at a time: asked, launched, told."""
        optuna = hyperparameter_search.quiet_optuna()
        dims = hyperparameter_search.dimensions(self.config, arguments)
        searched = hyperparameter_search.space(dims)
        fixed = hyperparameter_search.plain(arguments) + [f"{d.key}={d.text}" for d in dims if d.key not in searched]
        study = optuna.create_study(
            study_name=self.settings.study_name,
            storage=self.settings.storage,
            sampler=hyperparameter_search.sampler(self.settings.sampler, searched),
            direction=str(getattr(self.settings.direction, "name", self.settings.direction)),
            load_if_exists=True,
        )
        log.info(f"Study {study.study_name} in {self.settings.storage}: {self.settings.n_trials} trials")
        left = self._trials(searched)
        while left > 0:
            trials = [study.ask(searched) for _ in range(min(left, self.settings.n_jobs))]
            overrides = [[*(f"{k}={v}" for k, v in t.params.items()), *fixed] for t in trials]
            # Each job's folder is numbered after its trial (hydra.job.num), also when resuming.
            returns = self.launcher.launch(overrides, initial_job_idx=trials[0].number)
            self._tell(study, trials, returns)
            left -= len(trials)
        self._results(study)

    def _trials(self, searched: Dict[str, Any]) -> int:
        """``n_trials``, at most one per point of a grid sampler's grid."""
        if not hyperparameter_search.is_grid(self.settings.sampler):
            return self.settings.n_trials
        return min(self.settings.n_trials, math.prod(len(v) for v in hyperparameter_search.grid(searched).values()))

    def _tell(self, study: Any, trials: Sequence[Any], returns: Sequence[JobReturn]) -> None:
        """Each trial's value: what its job returned, or a failed trial (the job raised, or
        returned no number); too many failures in the batch stop the search with the first's error."""
        failed = []
        for trial, done in zip(trials, returns):
            value = _value(done)
            if value is None:
                failed.append(done)
            try:
                study.tell(trial, value, state=_state(value))
            except RuntimeError as err:
                # A grid sampler stops the study after its last point, which only optimize()
                # allows: the trial was stored before.
                if "Study.stop" not in str(err):
                    raise
        if failed and len(failed) / len(returns) > self.settings.max_failure_rate:
            for done in failed:
                done.return_value  # noqa: B018 - raises the job's own error, with its traceback

    def _results(self, study: Any) -> None:
        """The best trial, logged and written beside the study (Hydra's sweeper's file)."""
        best = [t for t in study.get_trials(deepcopy=False) if t.value is not None]
        if not best:
            return
        trial = study.best_trial
        log.info(f"Best value {trial.value} with {trial.params}")
        results = {"name": "optuna", "best_params": trial.params, "best_value": trial.value}
        OmegaConf.save(OmegaConf.create(results), f"{self.config.hydra.sweep.dir}/{RESULTS}")


def _value(done: JobReturn) -> Optional[float]:
    """The job's return as a number, or None (it raised, or returned something else)."""
    try:
        value = done.return_value
        if value is None:
            raise ValueError("its job returned no value")
        return float(value)
    except Exception as err:  # noqa: BLE001 - the job's error, told as a failed trial
        log.warning(f"A failed trial: {_line(err)}")
        return None


def _state(value: Optional[float]) -> Any:
    optuna = hyperparameter_search.quiet_optuna()
    return optuna.trial.TrialState.FAIL if value is None else optuna.trial.TrialState.COMPLETE


def _line(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0]
