"""Best against best: searches (``hydra/sweeper=optuna``), one per framework, side by side.

A search's trials are read from its job folders (each trial a job: its config, summary and
metrics), not from Optuna's database, so that the report needs no Optuna: a trial's value is what
the job returned (:func:`unitrain.train.objective.value`; the worst value for a failed one). Per
search: its trials, the best trial's value and settings, the median trial, how far the best is
from it, the best trial's time to a held-out target, and the search's wall time; a plot of every
trial's value with the running best. Searches over different spaces, trial counts or budgets are
said to be compared unfairly.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml
from omegaconf import OmegaConf

from unitrain.report import style
from unitrain.report.runs import results_under
from unitrain.tasks.registry import task_of
from unitrain.tasks.task import Measure
from unitrain.train import objective

#: A search's record (written as it starts): its config, search space and overrides included.
RECORD = "search.yaml"


@dataclass(frozen=True, kw_only=True)
class Trial:
    number: int
    value: float
    settings: Dict[str, str]
    finished: bool
    seconds: Optional[float]  # the job's wall time
    to_target: Optional[float]  # seconds until the task's held-out measure first reached the target


@dataclass(frozen=True, kw_only=True)
class Search:
    sweep_dir: Path
    framework: str
    metric: str
    direction: str
    space: Dict[str, str]
    budget: str
    trials: List[Trial]
    target: Optional[float]  # the held-out measure the times are to: the objective's, or the report's

    def best(self) -> Optional[Trial]:
        done = [t for t in self.trials if math.isfinite(t.value)]
        if not done:
            return None
        return (max if self.direction == "maximize" else min)(done, key=lambda t: t.value)


def record(config: Any, sweep_dir: Path) -> None:
    """What the report reads of a search (Hydra's sweepers other than the basic one write no
    multirun.yaml)."""
    OmegaConf.save(config, Path(sweep_dir) / RECORD)


def searches(dirs: Sequence[str | Path], target: Optional[float] = None) -> List[Search]:
    """Every search in or under ``dirs`` (a folder holding Optuna's record of a sweep)."""
    found = []
    for record in sorted({f.resolve() for d in map(Path, dirs) for f in results_under(d, RECORD)}):
        sweep = yaml.safe_load(record.read_text()) or {}
        sweeper = (sweep.get("hydra") or {}).get("sweeper") or {}
        if sweeper.get("_target_") not in (objective.OPTUNA, objective.OPTUNA_BEFORE):
            continue
        found.append(_search(record.parent, sweep, sweeper, target))
    return found


def _search(sweep_dir: Path, sweep: Dict[str, Any], sweeper: Dict[str, Any], target: Optional[float]) -> Search:
    space = {str(k): str(v) for k, v in (sweeper.get("params") or {}).items()}
    for override in (sweep.get("hydra") or {}).get("overrides", {}).get("task", []):
        key, _, value = str(override).partition("=")
        if value.split("(")[0] in ("interval", "choice", "range", "tag"):
            space[key] = value
    cfg = OmegaConf.create({k: v for k, v in sweep.items() if k != "hydra"})
    goal = target if target is not None else cfg.objective.target
    measure = task_of(cfg).measure
    trials = [_trial(job, cfg.objective, space, goal, measure) for job in _jobs(sweep_dir)]
    return Search(
        sweep_dir=sweep_dir,
        framework=str(cfg.backend.name),
        metric=str(cfg.objective.metric),
        direction=objective.direction(cfg.objective, measure),
        space=space,
        budget=f"{cfg.trainer.steps or cfg.trainer.epochs} {'steps' if cfg.trainer.steps else 'epochs'} of "
        f"{cfg.trainer.batch_size} on {cfg.data.name}",
        trials=sorted(trials, key=lambda t: t.number),
        target=goal,
    )


def _jobs(sweep_dir: Path) -> List[Path]:
    return [
        p for p in sweep_dir.iterdir() if (p / ".hydra" / "overrides.yaml").exists() and p.name.split("_")[0].isdigit()
    ]


def _summary(job: Path) -> Optional[Dict[str, Any]]:
    try:
        return json.loads((job / "summary.json").read_text())
    except (OSError, ValueError):
        return None  # the trial failed, or was killed


def _trial(job: Path, goal_cfg: Any, space: Dict[str, str], target: Optional[float], measure: Measure) -> Trial:
    overrides = dict(str(o).split("=", 1) for o in yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()))
    summary = _summary(job)
    return Trial(
        number=int(job.name.split("_")[0]),
        value=objective.value(goal_cfg, summary, job, measure),
        settings={key: overrides.get(key, "?") for key in space},
        finished=summary is not None,
        seconds=(summary or {}).get("wall_time_s"),
        to_target=objective.seconds_to(target, job / "metrics.jsonl", measure) if target is not None else None,
    )


def fairness(found: List[Search]) -> List[str]:
    """What makes searches unequal: their spaces, trial counts, budgets."""
    said = []
    for what, of in (("search spaces", lambda s: s.space), ("trial counts", lambda s: len(s.trials))):
        if len({repr(of(s)) for s in found}) > 1:
            said.append(f"the searches differ in their {what}: " + "; ".join(f"{s.framework}: {of(s)}" for s in found))
    if len({s.budget for s in found}) > 1:
        said.append(
            "the searches' trials have different budgets: " + "; ".join(f"{s.framework}: {s.budget}" for s in found)
        )
    return said


def rows(found: List[Search]) -> List[Dict[str, str]]:
    """One row a search: best against best."""
    out = []
    for search in found:
        best, values = search.best(), [t.value for t in search.trials if math.isfinite(t.value)]
        median = statistics.median(values) if values else None
        out.append(
            {
                "framework": search.framework,
                "trials (finished / all)": f"{sum(t.finished for t in search.trials)} / {len(search.trials)}",
                "budget per trial": search.budget,
                f"best {search.metric}": f"{best.value:.4f}" if best else "none finished",
                "best settings": ", ".join(f"{k}={v}" for k, v in best.settings.items()) if best else "",
                "median trial": f"{median:.4f}" if median is not None else "",
                "best - median": f"{best.value - median:+.4f}" if best and median is not None else "",
                "best's time to target": _seconds(best.to_target)
                if best and search.target is not None
                else "n/a (no target)",
                "search wall time": _seconds(sum(t.seconds or 0.0 for t in search.trials)),
            }
        )
    return out


def _seconds(value: Optional[float]) -> str:
    return "not reached" if value is None else f"{value:.1f} s"


def plot(found: List[Search], out: Path) -> Path:
    """search.png: every trial's value by trial number, and each search's running best."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = style.colors()
    fig, ax = plt.subplots(figsize=(8, 4))
    for search in found:
        shown = [t for t in search.trials if math.isfinite(t.value)]
        color = colors.get(search.framework)
        ax.scatter([t.number for t in shown], [t.value for t in shown], color=color, label=f"{search.framework} trials")
        running, best = [], None
        for t in shown:
            better = best is None or (t.value > best if search.direction == "maximize" else t.value < best)
            best = t.value if better else best
            running.append(best)
        ax.step([t.number for t in shown], running, where="post", color=color, label=f"{search.framework} best so far")
    metric = found[0].metric if found else ""
    ax.set(title="search: every trial and the best so far", xlabel="trial", ylabel=metric)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "search.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
