"""Where MLflow keeps runs (``trainer.loggers=[mlflow]``), and whether it can be used before a
job starts: ``MLFLOW_TRACKING_URI`` when set (a server, a database), else an SQLite file in the
run tree with the artifacts beside it; a server that answers, an SQLite file that can be written,
a database whose driver is installed. URIs are recorded without their credentials, and a
server's are handed to MLflow as its own variables (:func:`environment_uri`). Also the mlflow
package, imported quietly, and its client."""

from __future__ import annotations

import base64
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
import warnings
from pathlib import Path
from typing import Any, Optional

from unitrain.errors import BackendUnavailableError, ConfigError
from unitrain.host.atomic import cannot_create_in

STORE = "mlflow.db"
ARTIFACTS = "mlartifacts"
ENV_URI = "MLFLOW_TRACKING_URI"
#: Where MLflow's client takes a server's user and password from (HTTP basic authentication).
ENV_USER = "MLFLOW_TRACKING_USERNAME"
ENV_PASSWORD = "MLFLOW_TRACKING_PASSWORD"


def import_mlflow() -> Any:
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


def mlflow_client(uri: str) -> Any:
    mlflow = import_mlflow()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mlflow.tracking.MlflowClient(tracking_uri=uri)


def environment_uri() -> Optional[str]:
    """``MLFLOW_TRACKING_URI``, None when unset. A server's user and password in it
    (``http://user:pw@host:port``) are first moved into MLflow's own variables of this process,
    ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, which MLflow's client sends as
    HTTP basic authentication, and the URI is left without them, for this process and every
    process it starts (a sweep's jobs, a job's workers): MLflow's client prints its URI on stdout
    ("View run ... at: <uri>/#/..." as each run ends), which a console log keeps. A database's
    URI keeps its credentials: its driver reads them there, and MLflow prints none of it."""
    uri = os.environ.get(ENV_URI)
    if not uri:
        return None
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme in ("http", "https") and "@" in parts.netloc:
        user, _, password = parts.netloc.rpartition("@")[0].partition(":")
        os.environ[ENV_USER] = urllib.parse.unquote(user)
        os.environ[ENV_PASSWORD] = urllib.parse.unquote(password)
        os.environ[ENV_URI] = uri = public_uri(uri)
    return uri


def tracking_uri(root: Path) -> str:
    """Where runs go: the environment's tracking URI, else an SQLite file in ``root``."""
    return environment_uri() or f"sqlite:///{(Path(root) / STORE).resolve()}"


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
    import_mlflow()
    uri = environment_uri()
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
    """The server's /health answers; a user and password (MLflow's variables, where
    :func:`environment_uri` moved the URI's) go as HTTP basic authentication, as MLflow's client
    sends them, never in the URL asked."""
    request = urllib.request.Request(public_uri(uri).rstrip("/") + "/health")
    user, password = os.environ.get(ENV_USER), os.environ.get(ENV_PASSWORD)
    if user and password:
        token = f"{user}:{password}".encode()
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


def artifact_location(root: Path) -> Optional[str]:
    """Where a new experiment's files go: beside an SQLite store (the run tree's own, or the
    file the environment names), in the run tree for another database, where a server keeps
    them (None) for a server. Never MLflow's default, ./mlruns of the folder the command ran in."""
    uri = environment_uri()
    if not uri:
        return (Path(root) / ARTIFACTS).resolve().as_uri()
    if _dialect(uri) == "sqlite" and _sqlite_file(uri) is not None:
        return (_sqlite_file(uri).resolve().parent / ARTIFACTS).as_uri()
    if _dialect(uri) in DATABASES:
        return (Path(root) / ARTIFACTS).resolve().as_uri()
    return None
