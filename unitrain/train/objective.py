"""What a job returns to a searching sweeper (``hydra/sweeper=optuna``): ``objective.metric`` of
the run as it finished, or the worst value for a run that failed, diverged or never reached its
target, so that a search counts such a trial as bad rather than stopping."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, Optional

from omegaconf import OmegaConf

from unitrain.tasks import Measure, task_of_summary

#: The sweeper that searches (it reads each job's return): unitrain's, hydra_plugins/unitrain_sweeper.
OPTUNA = "hydra_plugins.unitrain_sweeper.OptunaSweeper"
#: The one searches had before it (hydra-optuna-sweeper): their folders are still reported.
OPTUNA_BEFORE = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
#: objective.metric=time_to_target: seconds, minimized (heldout: the task's measure's direction).
TIME_TO_TARGET = "time_to_target"


def searching(hydra_cfg: Any) -> bool:
    """Whether the sweep is a search, whose jobs' returns the sweeper reads."""
    return OmegaConf.select(hydra_cfg, "sweeper._target_", default=None) == OPTUNA


def direction(objective: Any, measure: Measure) -> str:
    """The direction a search optimizes objective.metric in: the task's held-out measure's
    (a language model's held-out loss is minimized), or the time to its target (minimized)."""
    return "minimize" if str(objective.metric) == TIME_TO_TARGET else measure.direction


def worst(objective: Any, measure: Measure) -> float:
    return -math.inf if direction(objective, measure) == "maximize" else math.inf


def value(objective: Any, summary: Optional[Dict[str, Any]], run_dir: Path, measure: Optional[Measure] = None) -> float:
    """The run's objective; the worst value where it has none. ``measure``: the task's held-out
    measure (default: the one the summary's task has)."""
    measure = measure or task_of_summary(summary or {}).measure
    if not summary:
        return worst(objective, measure)
    if str(objective.metric) == TIME_TO_TARGET:
        found = seconds_to(objective.target, Path(run_dir) / "metrics.jsonl", measure)
    else:
        found = (summary.get("eval") or {}).get(measure.key)
    if found is None or not math.isfinite(found):
        return worst(objective, measure)
    return float(found)


def seconds_to(target: float, metrics: Path, measure: Measure) -> Optional[float]:
    """Seconds since training started (evaluations included) when the held-out measure first
    reached ``target`` (top-1 rose to it; a language model's loss fell to it), or None."""
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return None
    for record in map(json.loads, lines):
        if "loss" in record or measure.key not in record:  # a training step's, not an evaluation's
            continue
        if measure.reached(record[measure.key], target):
            return float(record["elapsed_s"])
    return None
