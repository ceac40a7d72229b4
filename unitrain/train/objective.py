"""What a job returns to a searching sweeper (``hydra/sweeper=optuna``): ``objective.metric`` of
the run as it finished, or the worst value for a run that failed, diverged or never reached its
target, so that a search counts such a trial as bad rather than stopping."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, Optional

from omegaconf import OmegaConf

#: The sweeper that searches (it reads each job's return): unitrain's, hydra_plugins/unitrain_sweeper.
OPTUNA = "hydra_plugins.unitrain_sweeper.OptunaSweeper"
#: The one searches had before it (hydra-optuna-sweeper): their folders are still reported.
OPTUNA_BEFORE = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
#: objective.metric -> the direction a search optimizes it in (a language model's held-out
#: measure is its loss: minimized).
DIRECTIONS = {"heldout": "maximize", "time_to_target": "minimize"}


def searching(hydra_cfg: Any) -> bool:
    """Whether the sweep is a search, whose jobs' returns the sweeper reads."""
    return OmegaConf.select(hydra_cfg, "sweeper._target_", default=None) == OPTUNA


def direction(objective: Any, text: bool = False) -> str:
    return "minimize" if text else DIRECTIONS[str(objective.metric)]


def worst(objective: Any, text: bool = False) -> float:
    return -math.inf if direction(objective, text) == "maximize" else math.inf


def value(objective: Any, summary: Optional[Dict[str, Any]], run_dir: Path, text: bool = False) -> float:
    """The run's objective; the worst value where it has none."""
    if not summary:
        return worst(objective, text)
    if str(objective.metric) == "heldout":
        held_out = summary.get("eval") or {}
        found = held_out.get("val_loss") if text else held_out.get("val_top1", held_out.get("val_auc"))
    else:
        found = seconds_to(objective.target, Path(run_dir) / "metrics.jsonl", text)
    if found is None or not math.isfinite(found):
        return worst(objective, text)
    return float(found)


def seconds_to(target: float, metrics: Path, text: bool = False) -> Optional[float]:
    """Seconds since training started (evaluations included) when the held-out top-1 first
    reached ``target`` (a language model: when its held-out loss first fell to it), or None."""
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return None
    for record in map(json.loads, lines):
        if "loss" in record:  # a training step's, not an evaluation's
            continue
        if (record.get("val_loss", math.inf) <= target) if text else (record.get("val_top1", -1.0) >= target):
            return float(record["elapsed_s"])
    return None
