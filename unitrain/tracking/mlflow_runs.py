"""``trainer.loggers=[mlflow]``: every run in MLflow, where teams already look.

A job is one MLflow run; a multirun (a grid or a search) is one experiment with a parent run and
a child per job. The store is ``MLFLOW_TRACKING_URI`` when set (a server, a database), else an
SQLite file in the run tree (``mlflow.db`` in the sweep's directory, or the run's) with the
artifacts beside it (``mlartifacts/``), so that nothing needs a server
(:mod:`unitrain.tracking.store`: where it is, and whether it can be used).

Hydra's process opens the run (the whole config as params), rank 0's trainer logs every step and
evaluation as it goes (:class:`MlflowSink`), and the job's end adds what the summary observed
(the framework's version, the precision that ran and the CPU as tags, its figures as metrics)
and the run's files. Only the node that holds the summary logs. ``mlflow.json`` in the run
directory names the MLflow run; it holds neither the environment nor a tracking URI's
credentials, and a server's credentials reach MLflow in its user and password variables, never in
the URI it prints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Literal, Optional, Tuple

from omegaconf import OmegaConf

from unitrain.errors import NothingLeftToRun, Refusal, Stopped
from unitrain.host.atomic import replace_text
from unitrain.host.console import RUN_LOG
from unitrain.host.machine import unitrain_version

# The store's names, imported here by the commands, the report and the tests.
from unitrain.tracking.store import (  # noqa: F401
    ARTIFACTS,
    ENV_URI,
    STORE,
    artifact_location,
    check_reachable,
    environment_uri,
    import_mlflow,
    mlflow_client,
    public_uri,
    tracking_uri,
)

RECORD = "mlflow.json"
#: The files of a run directory a tracked run keeps, when they exist.
RUN_FILES = ("summary.json", "metrics.jsonl", RUN_LOG, "report.html", "comparison.md")
#: MLflow takes at most this many params, and this many metrics, per call.
_PARAMS_PER_CALL = 100
_METRICS_PER_CALL = 1000
Status = Literal["FINISHED", "FAILED", "KILLED"]


@dataclass(frozen=True, kw_only=True)
class TrackedRun:
    """The MLflow run a run directory (or a sweep's) is logged to."""

    uri: str  # as recorded: without a server's credentials
    experiment_id: str
    run_id: str

    def client(self) -> Any:
        # A recorded URI has lost its credentials: the environment has them (a server's in
        # MLflow's user and password variables, moved there from the URI by environment_uri).
        return mlflow_client(environment_uri() or self.uri)

    def write(self, directory: Path) -> None:
        replace_text(Path(directory) / RECORD, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, directory: Path) -> Optional["TrackedRun"]:
        path = Path(directory) / RECORD
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def _experiment(client: Any, name: str, root: Path) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = artifact_location(root)
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # noqa: BLE001 - another job of the sweep created it meanwhile
        return client.get_experiment_by_name(name).experiment_id


def experiment_name(root: Path, sweep: bool) -> str:
    """``MLFLOW_EXPERIMENT_NAME``, else the sweep's directory (one experiment per sweep), else
    "unitrain" (single runs together)."""
    if os.environ.get("MLFLOW_EXPERIMENT_NAME"):
        return os.environ["MLFLOW_EXPERIMENT_NAME"]
    if not sweep:
        return "unitrain"
    root = Path(root).resolve()
    return str(root.relative_to(Path.cwd())) if root.is_relative_to(Path.cwd()) else str(root)


def flatten(tree: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """{dotted key: leaf} of a nested mapping (a config, a summary); lists are leaves."""
    out: Dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def start_sweep(cfg: Any, sweep_dir: Path) -> TrackedRun:
    """The parent run of a multirun's jobs."""
    client = mlflow_client(tracking_uri(sweep_dir))
    experiment = _experiment(client, experiment_name(sweep_dir, sweep=True), sweep_dir)
    run = client.create_run(
        experiment, run_name=f"sweep {Path(sweep_dir).name}", tags={"unitrain_version": unitrain_version()}
    )
    tracked = TrackedRun(uri=public_uri(tracking_uri(sweep_dir)), experiment_id=experiment, run_id=run.info.run_id)
    tracked.write(sweep_dir)
    return tracked


def start_run(cfg: Any, run_dir: Path, parent_dir: Optional[Path]) -> TrackedRun:
    """The run of one job, under ``parent_dir``'s run when it has one: the config as params."""
    parent = TrackedRun.read(parent_dir) if parent_dir else None
    root = Path(parent_dir) if parent else Path(run_dir)
    client = parent.client() if parent else mlflow_client(tracking_uri(root))
    experiment = parent.experiment_id if parent else _experiment(client, experiment_name(root, sweep=False), root)
    tags = {
        "framework": cfg.backend.name,
        "unitrain_version": unitrain_version(),
        "run_dir": str(Path(run_dir).resolve()),
    }
    if parent:
        tags["mlflow.parentRunId"] = parent.run_id
    name = Path(run_dir).name if parent else f"{cfg.backend.name} {Path(run_dir).name}"
    run = client.create_run(experiment, run_name=name, tags=tags)
    mlflow = import_mlflow()
    params = [mlflow.entities.Param(key, _text(value)) for key, value in flatten(_config(cfg)).items()]
    for i in range(0, len(params), _PARAMS_PER_CALL):
        client.log_batch(run.info.run_id, params=params[i : i + _PARAMS_PER_CALL])
    uri = parent.uri if parent else public_uri(tracking_uri(root))
    tracked = TrackedRun(uri=uri, experiment_id=experiment, run_id=run.info.run_id)
    tracked.write(run_dir)
    return tracked


def _config(cfg: Any) -> Dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)


def _text(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return text[:6000]  # MLflow's limit for a param's value


def finish_run(run_dir: Path, summary: Optional[Dict[str, Any]], status: Status) -> None:
    """What the job observed, its files, and its end."""
    tracked = TrackedRun.read(run_dir)
    if tracked is None:
        return
    client = tracked.client()
    if summary:
        tags = [import_mlflow().entities.RunTag(key, value) for key, value in observed_tags(summary).items()]
        client.log_batch(tracked.run_id, tags=tags)
        _log_metrics(client, tracked.run_id, [(f"summary.{k}", v, 0) for k, v in _figures(summary)])
    if not client.get_metric_history(tracked.run_id, "loss"):
        _log_metrics(client, tracked.run_id, list(_steps(Path(run_dir) / "metrics.jsonl")))
    log_files(tracked, [Path(run_dir) / name for name in RUN_FILES])
    client.set_terminated(tracked.run_id, status)


@contextlib.contextmanager
def tracked(cfg: Any, run_dir: Path, parent_dir: Optional[Path]) -> Iterator[Dict[str, Any]]:
    """One job's MLflow run around it: ``result["summary"]`` set by the job is what it logs at
    the end. A refused job's run is deleted; a stopped or failed one is marked so."""
    start_run(cfg, run_dir, parent_dir)
    result: Dict[str, Any] = {}
    try:
        yield result
    except (Refusal, NothingLeftToRun):
        _quietly(discard_run, run_dir)
        raise
    except (Stopped, KeyboardInterrupt):
        _quietly(finish_run, run_dir, None, "KILLED")
        raise
    except BaseException:
        _quietly(finish_run, run_dir, None, "FAILED")
        raise
    _quietly(finish_run, run_dir, result.get("summary"), "FINISHED")


def _quietly(step: Any, *args: Any) -> None:
    """Tracking at a job's end: a tracker that fails then neither hides the job's own failure
    nor turns its results into one (they are on disk)."""
    try:
        step(*args)
    except Exception as err:  # noqa: BLE001 - the job's own error is the one to show
        logging.getLogger("unitrain").warning("MLflow: could not record the run's end: %s", err)


def discard_run(run_dir: Path) -> None:
    """A refused job leaves nothing: its MLflow run goes with its run directory."""
    tracked = TrackedRun.read(run_dir)
    if tracked is not None:
        tracked.client().delete_run(tracked.run_id)
        (Path(run_dir) / RECORD).unlink(missing_ok=True)


def observed_tags(summary: Dict[str, Any]) -> Dict[str, str]:
    """What ran, as the run observed it (never as requested)."""
    precision = summary.get("precision") or {}
    cpu = summary.get("cpu") or {}
    tags = {
        "framework_version": summary.get("version"),
        "precision.requested": precision.get("requested"),
        "precision.effective": precision.get("effective"),
        "precision.impl": precision.get("impl"),
        "cpu.model": cpu.get("model"),
        "cpu.logical_cpus": cpu.get("logical_cpus"),
        "cpu.extensions": " ".join(cpu.get("extensions") or []),
        "host": summary.get("host"),
        "world_size": summary.get("world_size"),
        "threads": summary.get("threads"),
    }
    return {key: str(value) for key, value in tags.items() if value not in (None, "")}


def _figures(summary: Dict[str, Any]) -> Iterator[Tuple[str, float]]:
    for key, value in flatten(summary).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            yield key, float(value)


def _steps(path: Path) -> Iterator[Tuple[str, float, int]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        record = json.loads(line)
        yield from record_metrics(record)


def record_metrics(record: Dict[str, Any]) -> Iterator[Tuple[str, float, int]]:
    """(key, value, step) of one line of metrics.jsonl: a training step or an evaluation."""
    step = int(record.get("step", 0))
    for key, value in record.items():
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
            yield key, float(value), step


def _log_metrics(client: Any, run_id: str, metrics: List[Tuple[str, float, int]]) -> None:
    mlflow = import_mlflow()
    now = int(time.time() * 1000)
    entities = [mlflow.entities.Metric(key, value, now, step) for key, value, step in metrics]
    for i in range(0, len(entities), _METRICS_PER_CALL):
        client.log_batch(run_id, metrics=entities[i : i + _METRICS_PER_CALL])


def log_files(tracked: TrackedRun, files: List[Path], artifact_path: Optional[str] = None) -> None:
    client = tracked.client()
    for path in files:
        if Path(path).is_file():
            client.log_artifact(tracked.run_id, str(path), artifact_path)


class MlflowSink:
    """Rank 0's steps and evaluations, sent in batches (one database write per batch, not per
    value) at most every few seconds, and at the end."""

    EVERY_S = 5.0

    def __init__(self, run_dir: Path):
        self.tracked = TrackedRun.read(run_dir)
        self.client = self.tracked.client() if self.tracked else None
        self.pending: List[Tuple[str, float, int]] = []
        self.sent_at = time.monotonic()

    def log(self, step: int, record: Dict[str, float]) -> None:
        if self.client is None:
            return
        self.pending += list(record_metrics(record))
        if time.monotonic() - self.sent_at >= self.EVERY_S:
            self.flush()

    def flush(self) -> None:
        if self.client is not None and self.pending:
            _log_metrics(self.client, self.tracked.run_id, self.pending)
        self.pending, self.sent_at = [], time.monotonic()

    def close(self) -> None:
        self.flush()
