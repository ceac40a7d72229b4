"""Reading runs for the comparison: a Run is one finished training run's summary.json, metrics.jsonl
and Hydra config. load_runs finds every run in or under run, multirun and repeat directories and
skips, with a one-line warning, those killed before their end or whose files are garbled;
group_repeats puts the repeats of one job together; inference_results finds the inference
benchmarks' results. Which config keys are axes of comparison (is_compared) lives here too,
since a run's config hash leaves them out.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from unitrain.tasks.registry import task_of_summary
from unitrain.tasks.task import Task
from unitrain.tracking.mlflow_runs import ARTIFACTS, flatten
from unitrain.train.metrics import own_records

# What may differ between compared runs without making the comparison unfair: the axes of
# comparison themselves. Anything else (threads, data, image size, steps...) draws a warning,
# unless a multirun swept it on purpose.
COMPARED_KEYS = (
    "backend",
    "amp",
    "dist",
    "trainer.seed",
    "trainer.repeats",
    "profiler",
    "trainer.progress",
    "trainer.log_every",
)
# Settings that change how a job was run, not what it computed: a resumed run repeats the
# uninterrupted one step for step (tests/test_checkpoint.py), so where it resumed from is no
# reason to doubt the comparison.
SAME_JOB_KEYS = ("trainer.resume",)
#: What a summary.json must hold to be compared (a run killed before its end has none of it).
REQUIRED = (
    "backend",
    "framework",
    "version",
    "device",
    "threads",
    "seed",
    "world_size",
    "global_batch_size",
    "precision",
    "profiler",
)


class UnusableRun(ValueError):
    """A run directory whose results cannot be compared; the report goes on without it."""


@dataclass
class Run:
    dir: Path
    summary: Dict[str, Any]
    metrics: List[Dict[str, float]]
    config: Dict[str, Any]
    swept: List[str] = field(default_factory=list)
    evals: List[Dict[str, float]] = field(default_factory=list)  # held-out evaluations, in order

    @property
    def label(self) -> str:
        s = self.summary
        tuned = " tuned" if settings_of(self) == "tuned" else ""
        return f"{s['backend']}{tuned} {s['precision']['requested']}" + (
            f" x{s['world_size']}" if s["world_size"] > 1 else ""
        )

    @property
    def task(self) -> Task:
        """What the run learned (its summary's task or data): the table's held-out columns and rate."""
        return task_of_summary(self.summary)

    @property
    def own_steps(self) -> List[Dict[str, float]]:
        """The steps this run's framework ran (a run resumed from the other framework's
        checkpoint keeps that framework's steps, marked, in its metrics)."""
        return own_records(self.metrics) or self.metrics

    @property
    def config_hash(self) -> str:
        """A hash of everything but the compared axes: equal hashes, equal jobs apart from those."""
        fair = {k: v for k, v in flatten(self.config).items() if not is_compared(k, ())}
        return hashlib.sha256(json.dumps(fair, sort_keys=True, default=str).encode()).hexdigest()[:12]

    @property
    def repeat_key(self) -> str:
        """Runs with the same key are repeats of one job (they may differ only by the seed)."""
        config = {k: v for k, v in flatten(self.config).items() if k != "trainer.seed"}
        return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def is_compared(key: str, swept) -> bool:
    """Whether ``key`` may differ between compared runs: an axis of comparison, a same-job
    setting, or a key the multirun swept on purpose."""
    return any(key == a or key.startswith(a + ".") for a in (*COMPARED_KEYS, *SAME_JOB_KEYS, *swept))


def settings_of(run: Run) -> str:
    """ "tuned" or "same settings", from what the run recorded (runs that recorded no reading: same)."""
    return (run.summary.get("tuning") or {}).get("settings", "same settings")


def _hydra_dir(run_dir: Path) -> Optional[Path]:
    for d in (run_dir, run_dir.parent):  # repeats live one level below the job directory
        if (d / ".hydra" / "config.yaml").exists():
            return d / ".hydra"
    return None


def _swept_keys(run_dir: Path) -> List[str]:
    """Keys a multirun swept on purpose (``key=a,b``), from the sweep's multirun.yaml."""
    for d in (run_dir.parent, run_dir.parent.parent):
        if (d / "multirun.yaml").exists():
            from hydra.core.override_parser.overrides_parser import OverridesParser

            task = yaml.safe_load((d / "multirun.yaml").read_text())["hydra"]["overrides"]["task"]
            parsed = OverridesParser.create().parse_overrides(task)
            return [o.key_or_group.lstrip("+~") for o in parsed if o.is_sweep_override()]
    return []


def _read_summary(summary_file: Path) -> Dict[str, Any]:
    try:
        summary = json.loads(summary_file.read_text())
    except ValueError as err:
        raise UnusableRun(f"not valid JSON ({err})") from None
    if not isinstance(summary, dict):
        raise UnusableRun("not a JSON object")
    missing = [k for k in REQUIRED if k not in summary]
    if missing:
        raise UnusableRun(f"incomplete: no {', '.join(missing)}")
    return summary


def _read_records(metrics_file: Path) -> List[Dict[str, float]]:
    records = []
    if metrics_file.exists():
        for number, line in enumerate(metrics_file.read_text().splitlines(), 1):
            try:
                records.append(json.loads(line))
            except ValueError:
                raise UnusableRun(f"{metrics_file.name} line {number} is not valid JSON") from None
    return records


def _read_run(summary_file: Path) -> Run:
    run_dir = summary_file.parent.resolve()
    summary = _read_summary(summary_file)
    records = _read_records(run_dir / "metrics.jsonl")
    steps = [r for r in records if "loss" in r and "ips" in r]
    if not steps:
        raise UnusableRun("it recorded no training step")
    hydra = _hydra_dir(run_dir)
    return Run(
        dir=run_dir,
        summary=summary,
        metrics=steps,
        config=(yaml.safe_load((hydra / "config.yaml").read_text()) or {}) if hydra else {},
        swept=_swept_keys(run_dir),
        evals=[r for r in records if "val_top1" in r],
    )


def _is_ps(summary_file: Path) -> bool:
    try:
        summary = json.loads(summary_file.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("kind") == "ps"


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def results_under(folder: Path, name: str) -> List[Path]:
    """Every file called ``name`` in or under ``folder``, leaving out MLflow's artifact store,
    which holds copies of tracked runs' files."""
    return sorted(f for f in Path(folder).rglob(name) if ARTIFACTS not in f.relative_to(folder).parts)


def load_runs(dirs: Sequence[str | Path], warn=None) -> List[Run]:
    """Every run in the given run, multirun or repeat directories, each once. A run whose
    results are garbled or incomplete is skipped with a one-line warning naming its file."""
    warn = warn or _to_stderr
    found: Dict[Path, Run] = {}
    for d in map(Path, dirs):
        files = [d / "summary.json"] if (d / "summary.json").exists() else results_under(d, "summary.json")
        unfinished = _unfinished(d)
        for run in unfinished:
            warn(f"unitrain.compare: warning: skipping {run}: it has no summary.json (the run did not finish)")
        if not files and not unfinished:
            raise FileNotFoundError(f"no summary.json in {d} or below it: not a unitrain run or multirun directory")
        for f in files:
            if _is_ps(f):
                continue  # parameter-server jobs have their own table (ps_report)
            try:
                found[f.parent.resolve()] = _read_run(f)
            except (UnusableRun, OSError, yaml.YAMLError) as err:
                warn(f"unitrain.compare: warning: skipping {f}: {err}")
    if not found:
        raise FileNotFoundError(f"no usable run in {', '.join(map(str, dirs))}: every run found was skipped")
    return list(found.values())


def _unfinished(folder: Path) -> List[Path]:
    """Run directories in or under ``folder`` that Hydra started (``.hydra/``) and that hold no
    summary.json, themselves or in a repeat below them: killed, or still running."""
    started = [p.parent.parent for p in sorted(folder.rglob(".hydra/config.yaml"))]
    return [run for run in started if not (run / "summary.json").exists() and not any(run.rglob("*/summary.json"))]


def group_repeats(runs: List[Run]) -> List[List[Run]]:
    """Runs of the same configuration (up to the seed) form one group, in first-seen order."""
    groups: Dict[str, List[Run]] = {}
    for run in runs:
        groups.setdefault(run.repeat_key, []).append(run)
    return list(groups.values())


def inference_results(dirs: Sequence[str | Path], warn=None) -> List[Tuple[Path, Dict[str, Any]]]:
    """Every ``inference.json`` (``python -m unitrain.infer``) in or under the given directories."""
    warn = warn or _to_stderr
    found = []
    for f in sorted({f.resolve() for d in map(Path, dirs) for f in results_under(d, "inference.json")}):
        try:
            result = json.loads(f.read_text())
            result["rows"], result["batches"], result["cpu"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            warn(f"unitrain.compare: warning: skipping {f}: {type(err).__name__}: {err}")
            continue
        found.append((f, result))
    return found
