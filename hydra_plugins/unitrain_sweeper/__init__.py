"""``hydra/sweeper=optuna``: unitrain's Optuna sweeper, as Hydra finds it.

Hydra imports every module under the ``hydra_plugins`` namespace at every start, and instantiates
only sweepers defined there: this module declares the sweeper's config (the keys of Hydra's own
Optuna sweeper that unitrain's searches use), a thin sweeper class and its registration, all on
this side: unitrain has no import of this module (where Hydra's scan misses it, in an editable
install, unitrain loads the class by the name its config gives, as Hydra loads a ``_target_``, and
calls :meth:`OptunaSweeper.register`). Optuna and the search's logic
(:mod:`unitrain.launch.optuna_sweeper`) are imported when a search runs, not here.
"""

# No `from __future__ import annotations`: Hydra's scan runs this module before it is in
# sys.modules, where dataclasses look string annotations up.
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import MISSING, DictConfig


@dataclass
class SamplerConfig:
    _target_: str = MISSING


@dataclass
class TPESamplerConfig(SamplerConfig):
    _target_: str = "optuna.samplers.TPESampler"
    seed: Optional[int] = None
    n_startup_trials: int = 10
    n_ei_candidates: int = 24


@dataclass
class RandomSamplerConfig(SamplerConfig):
    _target_: str = "optuna.samplers.RandomSampler"
    seed: Optional[int] = None


@dataclass
class CmaEsSamplerConfig(SamplerConfig):
    _target_: str = "optuna.samplers.CmaEsSampler"
    seed: Optional[int] = None
    sigma0: Optional[float] = None
    n_startup_trials: int = 1


@dataclass
class NSGAIISamplerConfig(SamplerConfig):
    _target_: str = "optuna.samplers.NSGAIISampler"
    seed: Optional[int] = None
    population_size: int = 50


@dataclass
class GridSamplerConfig(SamplerConfig):
    # The grid (every value of every dimension) is built by the sweeper from the search space;
    # the seed orders the grid's points.
    _target_: str = "optuna.samplers.GridSampler"
    seed: Optional[int] = None


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.unitrain_sweeper.OptunaSweeper"
    # The sampler reaches the sweeper as its config: a grid sampler is built from the search space.
    _recursive_: bool = False
    defaults: List[Any] = field(default_factory=lambda: [{"sampler": "tpe"}])
    sampler: SamplerConfig = MISSING
    # minimize or maximize; unitrain sets it from the objective (unitrain.train.objective).
    direction: str = "minimize"
    # An Optuna storage URL; unitrain's default is sqlite:///<sweep dir>/optuna.db.
    storage: Optional[str] = None
    study_name: Optional[str] = None
    # Trials this command runs.
    n_trials: int = 20
    # Trials asked, launched and told together: one, as trials side by side time each other.
    n_jobs: int = 1
    # The share of a batch's jobs that may raise before the search stops (a job that fails
    # returns the objective's worst value instead, see unitrain.app).
    max_failure_rate: float = 0.0
    # {key: "interval(a, b)" | "choice(...)" | "range(...)" | "tag(log, interval(a, b))"}
    params: Optional[Dict[str, str]] = None


class OptunaSweeper(Sweeper):
    """Hydra's side of the search; :class:`unitrain.launch.optuna_sweeper.AskAndTell` does it."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from unitrain.launch.optuna_sweeper import AskAndTell

        self.search = AskAndTell.setup(
            self.settings, hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: List[str]) -> None:
        self.search.sweep(arguments)

    @classmethod
    def register(cls) -> None:
        """This sweeper known to Hydra: its configs stored again (after Hydra's scan of hydra_plugins,
        they win over another plugin's hydra/sweeper=optuna registered meanwhile) and the class among
        Hydra's plugins, also where the scan did not list this module (an editable install's finder,
        pip install -e, does not list the hydra_plugins namespace)."""
        store_configs()
        Plugins.instance().register(cls)


def store_configs() -> None:
    """hydra/sweeper=optuna and its samplers in Hydra's ConfigStore."""
    store = ConfigStore.instance()
    store.store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf, provider="unitrain")
    samplers = {
        "tpe": TPESamplerConfig,
        "random": RandomSamplerConfig,
        "cmaes": CmaEsSamplerConfig,
        "nsgaii": NSGAIISamplerConfig,
        "grid": GridSamplerConfig,
    }
    for name, node in samplers.items():
        store.store(group="hydra/sweeper/sampler", name=name, node=node, provider="unitrain")


# Hydra's scan imports this module while it builds its Plugins, which registers the class: only the
# configs here.
store_configs()
