"""trainer.loggers=[mlflow]: every run in MLflow, read back with MLflow's own client."""

from __future__ import annotations

import json
import os
import shutil
import warnings

import pytest

from conftest import FAST, holding_the_environment, refusal, run_unitrain

pytest.importorskip("mlflow")

JOB = [*FAST, "data=synthetic", "trainer.batch_size=4", "trainer.steps=3", "trainer.loggers=[mlflow]"]


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MlflowClient(tracking_uri=uri)


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _flat(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], tree


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    done = run_unitrain(["backend=torch", *JOB, "trainer.checkpoint_every=3"], tmp_path_factory.mktemp("tracked"))
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((done.run_dir / "mlflow.json").read_text())
    client = _client(record["uri"])
    return done, client, client.get_run(record["run_id"])


@pytest.mark.slow  # MLflow creates its tables (about 8 s) and the run trains
def test_a_tracked_run_has_its_whole_config_as_params(tracked_run):
    import yaml

    done, _, run = tracked_run
    config = yaml.safe_load((done.run_dir / ".hydra" / "config.yaml").read_text())
    assert set(run.data.params) == {key for key, _ in _flat(config)}
    assert run.data.params["trainer.steps"] == "3" and run.data.params["backend.name"] == "torch"
    assert run.info.status == "FINISHED"


@pytest.mark.slow  # MLflow creates its tables (about 8 s) and the run trains
def test_a_tracked_run_says_what_ran_as_it_observed_it(tracked_run):
    done, _, run = tracked_run
    summary, tags = done.summary(), run.data.tags
    assert tags["framework"] == "torch" and tags["framework_version"] == summary["version"]
    assert tags["precision.effective"] == summary["precision"]["effective"]
    assert (
        tags["cpu.model"] == summary["cpu"]["model"] and tags["cpu.extensions"].split() == summary["cpu"]["extensions"]
    )
    assert run.data.metrics["summary.final.loss"] == pytest.approx(summary["final"]["loss"])


@pytest.mark.slow  # MLflow creates its tables (about 8 s) and the run trains
def test_a_tracked_run_logs_every_step_and_keeps_its_files(tracked_run):
    done, client, run = tracked_run
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(r["step"], pytest.approx(r["loss"])) for r in done.metrics()]
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "metrics.jsonl", "unitrain.log"} <= files
    assert holding_the_environment(done.run_dir) == []


@pytest.mark.slow
def test_an_export_of_a_tracked_run_joins_its_mlflow_run(tracked_run, tmp_path):
    import subprocess
    import sys

    done, client, run = tracked_run
    out = tmp_path / "export"
    exported = subprocess.run(
        [sys.executable, "-m", "unitrain.export", str(done.run_dir), f"--out={out}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert f"MLflow: export.json logged to run {run.info.run_id}" in exported.stdout
    assert [a.path for a in client.list_artifacts(run.info.run_id, "export")] == ["export/export.json"]


@pytest.fixture(scope="module")
def tracked_sweep(tmp_path_factory):
    """Both frameworks, each data parallel on 2 processes, in one tracked multirun."""
    from unitrain.host.ports import free_port

    root = tmp_path_factory.mktemp("tracked-sweep")
    args = ["-m", "backend=paddle,torch", *JOB, "dist.nproc_per_node=2", "trainer.threads=1"]
    done = run_unitrain([*args, f"dist.master_port={free_port()}"], root, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    sweep = root / "multirun"
    record = json.loads((sweep / "mlflow.json").read_text())
    return sweep, record, _client(record["uri"])


@pytest.mark.slow
def test_a_sweep_is_one_experiment_with_a_parent_and_rank_0s_steps_per_job(tracked_sweep):
    """One child run per job under the sweep's parent, each with its steps once (only rank 0
    logs), and the report on the parent."""
    sweep, record, client = tracked_sweep
    runs = client.search_runs([record["experiment_id"]])
    parent = next(r for r in runs if r.info.run_id == record["run_id"])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["framework"] for r in children) == ["paddle", "torch"]
    for child in children:
        assert child.data.tags["world_size"] == "2" and child.info.status == "FINISHED"
        assert [m.step for m in client.get_metric_history(child.info.run_id, "loss")] == [1, 2, 3]
    assert {"report.html", "comparison.md"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    # The artifact store's copies of the jobs' files are not runs of the comparison.
    assert (sweep / "comparison.md").read_text().count("| tiny |") == 2
    assert holding_the_environment(sweep) == []


@pytest.mark.slow
def test_mlflows_own_server_shows_the_sweep_and_a_browser_renders_it(tracked_sweep, tmp_path):
    """``mlflow server`` on the sweep's store serves the runs, and headless Chromium draws its
    run view (the screenshot docs/sweeps-and-tracking.md shows)."""
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from unitrain.host.ports import free_port

    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        pytest.skip("no chromium or chromedriver (make chromium installs Debian's chromium and chromium-driver)")
    pytest.importorskip("selenium")
    sweep, record, _ = tracked_sweep
    port = free_port()
    mlflow = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", record["uri"], "--workers", "1"]
    server = subprocess.Popen(
        [*mlflow, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its workers go with it
        cwd=tmp_path,  # where it keeps the artifacts sent to it
        # Without the job runner (GenAI jobs, seven huey processes): it serves runs alike.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
        runs = json.loads(
            urllib.request.urlopen(
                urllib.request.Request(
                    f"{url}/api/2.0/mlflow/runs/search",
                    data=json.dumps({"experiment_ids": [record["experiment_id"]]}).encode(),
                    headers={"Content-Type": "application/json"},
                ),
                timeout=10,
            ).read()
        )["runs"]
        assert len(runs) == 3  # the parent and a child per framework
        children = {r["info"]["run_id"]: r["info"]["run_name"] for r in runs if r["info"]["run_id"] != record["run_id"]}
        experiments = json.dumps([record["experiment_id"]])
        compare = f"{url}/#/compare-runs?runs={json.dumps(list(children))}&experiments={experiments}"
        shot = tmp_path / "mlflow-runs.png"
        _draw_once_shown(compare.replace('"', "%22").replace(" ", ""), list(children.values()), shot, tmp_path)
        assert shot.stat().st_size > 20_000  # a page, drawn
        if os.environ.get("UNITRAIN_DOC_IMAGES"):
            shutil.copy(shot, os.environ["UNITRAIN_DOC_IMAGES"])
        _a_job_tracked_with_credentials_records_none(port, tmp_path / "job")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def _draw_once_shown(url: str, names: list[str], shot, tmp_path) -> None:
    """Headless Chromium, driven by Selenium, draws the page once every run name is on it: a
    real wait for the page's content (Chromium's own --screenshot with a virtual-time budget hung
    in 4 of 22 tries beside two to eight busy loops on 2 cores)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1400"]:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    browser = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    try:
        # About 25 s with four busy loops beside it on 2 cores; alone, under 10.
        browser.set_page_load_timeout(240)
        browser.get(url)
        WebDriverWait(browser, 240).until(
            lambda page: all(name in page.find_element(By.TAG_NAME, "body").text for name in names)
        )
        browser.save_screenshot(str(shot))
    finally:
        browser.quit()


def _a_job_tracked_with_credentials_records_none(port: int, root) -> None:
    """A server URI with a user and password, as MLflow's client takes it: the job is tracked
    there, and the password is in no file of the run and in no param or tag of its MLflow run."""
    uri = f"http://unitrain:s3cret-pw@127.0.0.1:{port}"
    done = run_unitrain(["backend=torch", *JOB], root, env={"MLFLOW_TRACKING_URI": uri})
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((done.run_dir / "mlflow.json").read_text())
    assert record["uri"] == f"http://127.0.0.1:{port}"
    assert [p for p in done.run_dir.rglob("*") if p.is_file() and b"s3cret-pw" in p.read_bytes()] == []
    run = _client(record["uri"]).get_run(record["run_id"])
    assert run.info.status == "FINISHED"
    assert not any("s3cret-pw" in str(v) for v in [*run.data.params.values(), *run.data.tags.values()])


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("http://127.0.0.1:{port}", "a tracking server that answers (it did not:"),
        ("ftp://example.org/x", "an http(s):// server or a database URI such as sqlite:///path"),
        ("file:///tmp/mlruns", "MLflow 3 refuses its filesystem backend"),
        ("sqlite:////proc/mlflow.db", "an SQLite file this user can write; /proc cannot be written"),
        ("sqlite:////nowhere/at/all/mlflow.db", "/nowhere/at/all is not a folder"),
        ("postgresql://u:s3cret@127.0.0.1/db", "postgresql needs psycopg: pip install 'psycopg[binary]'"),
        ("postgresql+psycopg2://u:s3cret@127.0.0.1/db", "postgresql needs psycopg2: pip install psycopg2-binary"),
        ("mysql://u:s3cret@127.0.0.1/db", "mysql needs MySQLdb: pip install mysqlclient"),
    ],
    ids=[
        "unreachable",
        "unknown scheme",
        "file store",
        "sqlite unwritable",
        "sqlite no folder",
        "no psycopg",
        "no psycopg2",
        "no mysql",
    ],
)
def test_a_tracking_uri_that_cannot_be_used_is_one_line_before_anything_runs(tmp_path, monkeypatch, uri, expected):
    from unitrain.host.ports import free_port

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri.format(port=free_port()))
    said = refusal(["backend=torch", *JOB], tmp_path)
    assert said is not None and said.startswith("unitrain: error: MLFLOW_TRACKING_URI=") and expected in said, said
    assert "\n" not in said and "s3cret" not in said and not os.listdir(tmp_path)


@pytest.mark.parametrize(
    "uri, public",
    [
        ("https://user:s3cret@mlflow.example.org:5000/x", "https://mlflow.example.org:5000/x"),
        ("http://user:s3cret@127.0.0.1:5078", "http://127.0.0.1:5078"),
        ("postgresql://user:s3cret@db.example.org:5432/mlflow", "postgresql://db.example.org:5432/mlflow"),
        ("postgresql+psycopg2://user:s3cret@db/mlflow", "postgresql+psycopg2://db/mlflow"),
        ("mysql+pymysql://user:s3cret@db/mlflow", "mysql+pymysql://db/mlflow"),
        ("mssql+pyodbc://user:s3cret@db/mlflow?driver=x", "mssql+pyodbc://db/mlflow?driver=x"),
        ("databricks://profile", "databricks://profile"),
        ("sqlite:////tmp/mlflow.db", "sqlite:////tmp/mlflow.db"),
    ],
)
def test_credentials_are_never_recorded_whatever_the_scheme(uri, public):
    from unitrain.tracking.mlflow_runs import public_uri

    assert public_uri(uri) == public


def test_artifacts_go_beside_a_named_sqlite_store_not_to_the_working_folder(tmp_path, monkeypatch):
    from unitrain.tracking.mlflow_runs import artifact_location

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/store/mlflow.db")
    assert artifact_location(tmp_path / "runs") == (tmp_path / "store" / "mlartifacts").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://db/mlflow")
    assert artifact_location(tmp_path / "runs") == (tmp_path / "runs" / "mlartifacts").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert artifact_location(tmp_path / "runs") is None  # the server keeps them
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert artifact_location(tmp_path / "runs") == (tmp_path / "runs" / "mlartifacts").as_uri()


def test_a_servers_credentials_move_from_the_uri_to_mlflows_own_variables(monkeypatch):
    """MLflow's client prints its tracking URI as each run ends ("View run ... at: <uri>/#/..."):
    a server's user and password go to MLFLOW_TRACKING_USERNAME/PASSWORD instead (this process's,
    so every process it starts), the URI left without them; a database's URI keeps its own."""
    from unitrain.tracking.store import environment_uri, tracking_uri

    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://me%40corp:s3cret%3Apw@mlflow.example.org:5000/x")
    assert environment_uri() == tracking_uri(".") == "https://mlflow.example.org:5000/x"
    assert os.environ["MLFLOW_TRACKING_URI"] == "https://mlflow.example.org:5000/x"
    assert (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]) == ("me@corp", "s3cret:pw")
    assert environment_uri() == "https://mlflow.example.org:5000/x"  # again: nothing more to move
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://u:other@db/mlflow")
    assert (
        environment_uri() == "postgresql://u:other@db/mlflow" and os.environ["MLFLOW_TRACKING_PASSWORD"] == "s3cret:pw"
    )


class _AuthProxy:
    """A server in front of ``mlflow server`` that passes on only the requests carrying
    ``user:password`` as HTTP basic authentication (401 otherwise), and counts both."""

    def __init__(self, upstream: str, user: str, password: str):
        import base64
        import threading
        import urllib.error
        import urllib.request
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        proxy = self
        self.passed, self.refused = 0, []

        class Handler(BaseHTTPRequestHandler):
            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Authorization") != expected:
                    proxy.refused.append(f"{self.command} {self.path}")
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                proxy.passed += 1
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
                request = urllib.request.Request(upstream + self.path, data=body or None, method=self.command)
                for key, value in headers.items():
                    request.add_header(key, value)
                try:
                    with urllib.request.urlopen(request, timeout=60) as answer:
                        status, kind, content = answer.status, answer.headers.get("Content-Type"), answer.read()
                except urllib.error.HTTPError as err:
                    status, kind, content = err.code, err.headers.get("Content-Type"), err.read()
                self.send_response(status)
                if kind:
                    self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow  # mlflow server starts (about 10 s), then a data-parallel job of a sweep
def test_a_password_in_the_tracking_uri_reaches_the_server_and_no_stream_or_file(tmp_path):
    """Before: with MLFLOW_TRACKING_URI=http://user:password@host:port, MLflow's own "View run
    ... at: http://user:password@..." lines went to stdout, two per run and six in a sweep. Now
    every request of the sweep's process, its job's and its workers' carries the credentials, and
    the password is on no stream and in no file of the run tree."""
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from unitrain.host.ports import free_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}"]
        + ["--workers", "1", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=tmp_path,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    proxy = None
    try:
        upstream = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{upstream}/health", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "mlflow server did not start"
                time.sleep(0.5)
        proxy = _AuthProxy(upstream, "unitrain", "s3cret-pw")
        uri = f"http://unitrain:s3cret-pw@127.0.0.1:{proxy.port}"
        root = tmp_path / "job"
        args = ["-m", "trainer.seed=1", "backend=torch", *JOB, "dist.nproc_per_node=2", "trainer.threads=1"]
        done = run_unitrain([*args, f"dist.master_port={free_port()}"], root, env={"MLFLOW_TRACKING_URI": uri})
        assert done.returncode == 0, done.stderr[-2000:]
        assert "s3cret" not in done.stdout + done.stderr
        assert [p for p in root.rglob("*") if p.is_file() and b"s3cret" in p.read_bytes()] == []
        assert proxy.refused == [] and proxy.passed > 10
        record = json.loads((root / "multirun" / "mlflow.json").read_text())
        assert record["uri"] == f"http://127.0.0.1:{proxy.port}"
        client = _client(upstream)
        runs = client.search_runs([record["experiment_id"]])
        assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
        child = next(r for r in runs if r.info.run_id != record["run_id"])
        assert [m.step for m in client.get_metric_history(child.info.run_id, "loss")] == [1, 2, 3]  # rank 0 sent them
    finally:
        if proxy is not None:
            proxy.close()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
