"""``trainer.loggers=[mlflow]``: every run in MLflow, where teams already look.

A job is one MLflow run; a multirun (a grid or a search) is one experiment with a parent run and
a child per job. The store is ``MLFLOW_TRACKING_URI`` when set (a server, a database), else an
SQLite file in the run tree (``mlflow.db`` in the sweep's directory, or the run's) with the
artifacts beside it (``mlartifacts/``), so that nothing needs a server.

Hydra's process opens the run (the whole config as params), rank 0's trainer logs every step and
evaluation as it goes (:class:`MlflowSink`), and the job's end adds what the summary observed
(the framework's version, the precision that ran and the CPU as tags, its figures as metrics)
and the run's files. Only the node that holds the summary logs. ``mlflow.json`` in the run
directory names the MLflow run; it holds neither the environment nor a tracking URI's
credentials.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Literal, Optional, Tuple

from omegaconf import OmegaConf

from unitrain.errors import BackendUnavailableError, ConfigError, NothingLeftToRun, Refusal, Stopped
from unitrain.host.atomic import cannot_create_in, replace_text
from unitrain.host.console import RUN_LOG
from unitrain.host.machine import unitrain_version

RECORD = "mlflow.json"
STORE = "mlflow.db"
ARTIFACTS = "mlartifacts"
ENV_URI = "MLFLOW_TRACKING_URI"
#: The files of a run directory a tracked run keeps, when they exist.
RUN_FILES = ("summary.json", "metrics.jsonl", RUN_LOG, "report.html", "comparison.md")
#: MLflow takes at most this many params, and this many metrics, per call.
_PARAMS_PER_CALL = 100
_METRICS_PER_CALL = 1000
Status = Literal["FINISHED", "FAILED", "KILLED"]


def _mlflow() -> Any:
    """The mlflow package, quiet: its table migrations log at INFO and SQLAlchemy warns about
    MLflow's own queries, none of it the user's business."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import mlflow
    except ImportError:
        raise BackendUnavailableError(
            "trainer.loggers=[mlflow] needs MLflow, which is not installed: pip install 'unitrain[tracking]'"
        ) from None
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return mlflow


def _client(uri: str) -> Any:
    mlflow = _mlflow()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mlflow.tracking.MlflowClient(tracking_uri=uri)


@dataclass(frozen=True, kw_only=True)
class TrackedRun:
    """The MLflow run a run directory (or a sweep's) is logged to."""

    uri: str  # as recorded: without a server's credentials
    experiment_id: str
    run_id: str

    def client(self) -> Any:
        # A recorded server URI has lost its credentials: the environment's has them.
        return _client(os.environ.get(ENV_URI) or self.uri)

    def write(self, directory: Path) -> None:
        replace_text(Path(directory) / RECORD, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, directory: Path) -> Optional["TrackedRun"]:
        path = Path(directory) / RECORD
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def tracking_uri(root: Path) -> str:
    """Where runs go: the environment's tracking URI, else an SQLite file in ``root``."""
    return os.environ.get(ENV_URI) or f"sqlite:///{(Path(root) / STORE).resolve()}"


#: The database dialects MLflow stores runs in, as SQLAlchemy names them (``dialect+driver://``).
DATABASES = ("sqlite", "postgresql", "mysql", "mssql")
#: The pip package of a database driver whose module is not the package's name (SQLAlchemy 2.1
#: reads postgresql:// as psycopg 3's, which needs libpq unless installed with its binary).
_DRIVER_PACKAGES = {
    "psycopg": "'psycopg[binary]'",
    "psycopg2": "psycopg2-binary",
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
}


def public_uri(uri: str) -> str:
    """``uri`` without the user and password any URI may carry (a server's, a database's)."""
    parts = urllib.parse.urlsplit(uri)
    if "@" in parts.netloc:
        return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return uri


def _dialect(uri: str) -> str:
    return urllib.parse.urlsplit(uri).scheme.split("+")[0]


def check_reachable() -> None:
    """MLflow is installed and the store the environment names can be used: a server answers,
    an SQLite file can be written, a database's driver is installed; else the job stops in one
    line before it starts."""
    _mlflow()
    uri = os.environ.get(ENV_URI)
    if not uri:
        return
    scheme = urllib.parse.urlsplit(uri).scheme
    if scheme in ("http", "https"):
        _check_server(uri)
    elif scheme == "file":
        raise ConfigError(
            ENV_URI,
            public_uri(uri),
            "a database or server URI (MLflow 3 refuses its filesystem backend: it is in maintenance mode); "
            "sqlite:///path/mlflow.db keeps runs in one file",
        )
    elif _dialect(uri) == "sqlite":
        _check_sqlite(uri)
    elif _dialect(uri) in DATABASES:
        _check_driver(uri)
    elif scheme != "databricks":
        raise ConfigError(ENV_URI, public_uri(uri), "an http(s):// server or a database URI such as sqlite:///path")


def _check_server(uri: str) -> None:
    """The server's /health answers; a user and password in the URI (which MLflow's client
    sends) go as HTTP basic authentication, never in the URL asked."""
    parts = urllib.parse.urlsplit(uri)
    request = urllib.request.Request(public_uri(uri).rstrip("/") + "/health")
    if "@" in parts.netloc:
        user, _, password = parts.netloc.rpartition("@")[0].partition(":")
        token = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(token).decode())
    try:
        urllib.request.urlopen(request, timeout=5).close()
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise ConfigError(
            ENV_URI,
            public_uri(uri),
            f"a tracking server that answers (it did not: {reason}), or unset for an SQLite file in the run tree",
        ) from None


def _sqlite_file(uri: str) -> Optional[Path]:
    """The file an sqlite URI names (None: an in-memory database)."""
    path = uri.split("://", 1)[1][1:] if "://" in uri else ""
    return Path(path) if path and path != ":memory:" else None


def _check_sqlite(uri: str) -> None:
    """The SQLite file exists and can be written, or can be made (SQLite makes no folders;
    MLflow retries a file it cannot open for minutes)."""
    path = _sqlite_file(uri)
    if path is None:
        raise ConfigError(ENV_URI, uri, "an SQLite file (sqlite:///path/mlflow.db): an in-memory store keeps nothing")
    why = None
    if path.exists():
        try:
            with open(path, "ab"):
                pass
        except OSError as err:
            why = f"{path} cannot be written ({err.strerror or err})"
    elif not path.parent.is_dir():
        why = f"{path.parent} is not a folder"
    else:
        reason = cannot_create_in(path.parent)
        why = f"{path.parent} cannot be written ({reason})" if reason else None
    if why:
        raise ConfigError(ENV_URI, uri, f"an SQLite file this user can write; {why}")


def _check_driver(uri: str) -> None:
    """The database's driver is installed (SQLAlchemy names it from the URI: ``postgresql://``
    means psycopg2, ``mysql://`` mysqlclient, ``mssql://`` pyodbc)."""
    from sqlalchemy.engine import make_url

    try:
        dialect = make_url(uri).get_dialect()
        load = getattr(dialect, "import_dbapi", None) or dialect.dbapi
        load()
    except ImportError as err:
        module = (err.name or str(err)).split(".")[0]
        package = _DRIVER_PACKAGES.get(module, module)
        raise ConfigError(
            ENV_URI,
            public_uri(uri),
            f"a database whose driver is installed; {_dialect(uri)} needs {module}: pip install {package}",
        ) from None
    except Exception as err:  # noqa: BLE001 - SQLAlchemy's words for a URI it cannot read
        raise ConfigError(ENV_URI, public_uri(uri), f"a database URI SQLAlchemy reads ({err})") from None


def _experiment(client: Any, name: str, root: Path) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = artifact_location(root)
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # noqa: BLE001 - another job of the sweep created it meanwhile
        return client.get_experiment_by_name(name).experiment_id


def artifact_location(root: Path) -> Optional[str]:
    """Where a new experiment's files go: beside an SQLite store (the run tree's own, or the
    file the environment names), in the run tree for another database, where a server keeps
    them (None) for a server. Never MLflow's default, ./mlruns of the folder the command ran in."""
    uri = os.environ.get(ENV_URI)
    if not uri:
        return (Path(root) / ARTIFACTS).resolve().as_uri()
    if _dialect(uri) == "sqlite" and _sqlite_file(uri) is not None:
        return (_sqlite_file(uri).resolve().parent / ARTIFACTS).as_uri()
    if _dialect(uri) in DATABASES:
        return (Path(root) / ARTIFACTS).resolve().as_uri()
    return None


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
    client = _client(tracking_uri(sweep_dir))
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
    client = parent.client() if parent else _client(tracking_uri(root))
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
    mlflow = _mlflow()
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
        tags = [_mlflow().entities.RunTag(key, value) for key, value in observed_tags(summary).items()]
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
    mlflow = _mlflow()
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
