"""Paddle's launcher writes no environment to disk in a unitrain job, however the job ends: as it
ships it writes every worker's whole environment into its log directory (envlog.N,
backup_env.N.json, its pod log), and tokens live in the environment. Each job here has the
planted variable and a temporary directory of its own; its launch folder is looked into while it
runs, and afterwards no file under either that directory or the run holds the variable, and no
process of the job is left. A folder a job killed outright left is removed by the next launch,
in one line; a running job's is not."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Set

import pytest

from conftest import FAST, PLANTED, PLANTED_VALUE, alive, descendants, holding_the_environment

# Each starts two-worker jobs and watches its own processes, in a temporary directory of its own.
pytestmark = pytest.mark.slow

JOB = ["backend=paddle", *FAST, "trainer.threads=1", "dist.nproc_per_node=2"]
LAUNCH_DIR = "unitrain-paddle-launch-"


def launch_dirs(tmpdir: Path) -> List[str]:
    return sorted(p.name for p in tmpdir.glob(f"{LAUNCH_DIR}*"))


class Job:
    """``python -m unitrain <args>`` with the planted variable and its temporary files in
    ``tmpdir``; ``held``: the files of its launch folder seen holding the variable while it ran."""

    def __init__(self, args: List[str], run_dir: Path, tmpdir: Path, **env: str):
        self.run_dir, self.tmpdir, self.held = run_dir, tmpdir, set()
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        tmpdir.mkdir(parents=True, exist_ok=True)
        self._out, self._err = run_dir.parent / "stdout", run_dir.parent / "stderr"
        with open(self._out, "w") as out, open(self._err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "unitrain", *JOB, *args, f"hydra.run.dir={run_dir}"],
                cwd=run_dir.parent,
                stdout=out,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1", PLANTED: PLANTED_VALUE, "TMPDIR": str(tmpdir), **env},
                start_new_session=True,
            )
        self.tree: Set[int] = set()

    @property
    def out(self) -> str:
        return self._out.read_text() + self._err.read_text()

    @property
    def err(self) -> str:
        return self._err.read_text()

    def look(self) -> None:
        for name in launch_dirs(self.tmpdir):
            try:
                self.held |= set(holding_the_environment(self.tmpdir / name))
            except OSError:  # removed meanwhile
                pass

    def workers(self) -> dict:
        """rank -> its status file (pid, status, time)."""
        found = {}
        for f in (self.run_dir / ".workers").glob("rank*.json"):
            try:
                status = json.loads(f.read_text())
            except (OSError, ValueError):  # being written
                continue
            found[status["rank"]] = status
        return found

    def steps(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        return path.read_text().count('"loss"') if path.exists() else 0

    def training(self, at_least: int = 5) -> None:
        """Wait until it has trained ``at_least`` steps, looking into its launch folder meanwhile."""
        deadline = time.monotonic() + 180
        while not (len(self.workers()) == 2 and self.steps() >= at_least):
            assert self.proc.poll() is None, self.out[-3000:]
            assert time.monotonic() < deadline, "the job did not start training in time"
            self.look()
            time.sleep(0.2)
        self.look()
        self.tree |= descendants(self.proc.pid) | {s["pid"] for s in self.workers().values()}
        assert len(self.tree) >= 3  # the launcher and two workers

    def wait(self, timeout: float = 300) -> int:
        """Its exit status, looking into its launch folder until it ends."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, "the job did not end in time"
            self.tree |= descendants(self.proc.pid)
            self.look()
            time.sleep(0.2)
        return self.proc.returncode

    def left_running(self, within: float = 30.0) -> Set[int]:
        """Its processes still running ``within`` seconds after it ended."""
        deadline = time.monotonic() + within
        while alive(self.tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        return alive(self.tree)

    def end_all(self) -> None:
        """Whatever a failed assertion left behind."""
        for pid in alive(self.tree | descendants(self.proc.pid) | {self.proc.pid}):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def removal(text: str) -> Optional[str]:
    """The one line that says which folders the launch removed (None: none)."""
    lines = [line for line in text.splitlines() if "by Paddle jobs that no longer run" in line]
    assert len(lines) <= 1, lines
    return lines[0] if lines else None


def assert_nothing_holds_the_environment(job: Job, *folders: Path) -> None:
    assert job.held == set(), f"the launcher wrote the environment: {sorted(job.held)}"
    for folder in folders:
        assert holding_the_environment(folder) == [], f"the environment was written under {folder}"


def test_a_job_that_ends_well_leaves_no_environment(tmp_path):
    job = Job(["trainer.steps=4"], tmp_path / "run", tmp_path / "tmp")
    try:
        assert job.wait() == 0, job.err[-3000:]
    finally:
        job.end_all()
    assert "-m unitrain.backends.paddle.elastic_launch " in job.out
    assert_nothing_holds_the_environment(job, job.tmpdir, job.run_dir)
    assert launch_dirs(job.tmpdir) == []  # removed at the end
    assert not list(job.run_dir.glob("envlog.*")) and not list(job.run_dir.glob("backup_env.*"))


def test_a_failing_job_leaves_no_environment_and_no_process(tmp_path):
    # A worker dies mid-run: the launcher shows the failed container (with its environment, as it
    # ships, when FLAGS_print_launcher_env is set), and the job ends in one line.
    job = Job(["trainer.steps=100000"], tmp_path / "run", tmp_path / "tmp", FLAGS_print_launcher_env="1")
    try:
        job.training()
        os.kill(job.workers()[1]["pid"], signal.SIGKILL)
        assert job.wait(timeout=120) not in (0, None)
        assert job.err.startswith("unitrain: error: rank 1 stopped without reporting"), job.err[-3000:]
        assert "Container failed" in (job.run_dir / "launcher.log").read_text()
        assert job.left_running() == set()
    finally:
        job.end_all()
    assert_nothing_holds_the_environment(job, job.tmpdir, job.run_dir)
    assert launch_dirs(job.tmpdir) == []


def test_a_killed_job_leaves_no_environment_and_no_process(tmp_path):
    job = Job(["trainer.steps=100000"], tmp_path / "run", tmp_path / "tmp")
    try:
        job.training()
        job.proc.kill()  # SIGKILL: nothing of the main process runs again
        job.proc.wait(timeout=60)
        assert job.left_running() == set()
    finally:
        job.end_all()
    # Its launch folder is left (nothing could remove it), named after it, holding no environment.
    (left,) = launch_dirs(job.tmpdir)
    assert left.startswith(f"{LAUNCH_DIR}{job.proc.pid}-")
    assert_nothing_holds_the_environment(job, job.tmpdir, job.run_dir)


def test_a_restarted_job_leaves_no_environment_and_no_process(tmp_path):
    # Paddle's elastic mode: an etcd server beside the launcher, the pod deployed twice.
    if shutil.which("etcd") is None:
        pytest.skip("no etcd server: `make etcd` installs Debian's etcd-server (Paddle restarts only with one)")
    args = ["trainer.steps=60", "trainer.checkpoint_every=10", "dist.max_restarts=1"]
    job = Job(args, tmp_path / "run", tmp_path / "tmp")
    try:
        job.training(at_least=15)
        os.kill(job.workers()[1]["pid"], signal.SIGKILL)
        assert job.wait() == 0, job.err[-3000:]
        assert json.loads((job.run_dir / "summary.json").read_text())["restarts"]["count"] == 1
        job.tree |= {s["pid"] for s in job.workers().values()}  # the restarted workers
        assert job.left_running() == set()
    finally:
        job.end_all()
    assert (job.run_dir / "etcd.log").exists()
    assert_nothing_holds_the_environment(job, job.tmpdir, job.run_dir)
    assert sorted(p.name for p in job.tmpdir.glob("unitrain-*")) == []  # its log folder and etcd's data, removed


def test_the_next_launch_removes_a_killed_jobs_folder_in_one_line_and_leaves_a_running_jobs(tmp_path):
    tmpdir = tmp_path / "tmp"
    killed = Job(["trainer.steps=100000"], tmp_path / "killed" / "run", tmpdir)
    jobs = [killed]
    try:
        killed.training()
        killed.proc.kill()
        killed.proc.wait(timeout=60)
        assert killed.left_running() == set()
        (left,) = launch_dirs(tmpdir)

        # The next launch removes it (it says so in its output, read once it ended, below).
        live = Job(["trainer.steps=100000"], tmp_path / "live" / "run", tmpdir)
        jobs.append(live)
        live.training()
        (running,) = launch_dirs(tmpdir)
        assert running != left

        # Named after a pid that runs now, but a later process (the pid was reused): removed too.
        # Named as an older unitrain named them (no pid): whose it is cannot be told, left.
        reused = tmpdir / f"{LAUNCH_DIR}{os.getpid()}-1-abcdefgh"
        unknown = tmpdir / f"{LAUNCH_DIR}abcdefgh"
        reused.mkdir()
        unknown.mkdir()
        (reused / "workerlog.0").write_text("left\n")

        following = Job(["trainer.steps=2"], tmp_path / "next" / "run", tmpdir)
        jobs.append(following)
        assert following.wait() == 0, following.err[-3000:]
        line = removal(following.out)
        assert line and line.endswith(
            f"removed 1 folder(s) left in {tmpdir} by Paddle jobs that no longer run: {reused.name}"
        )
        assert launch_dirs(tmpdir) == sorted([running, unknown.name])

        # The running job went on; it removes its own folder when it ends.
        assert live.proc.poll() is None and live.steps() > 5
        live.proc.send_signal(signal.SIGTERM)
        live.wait(timeout=90)
        assert live.left_running() == set()
        assert launch_dirs(tmpdir) == [unknown.name]
        line = removal(live.out)
        assert line and line.endswith(f"removed 1 folder(s) left in {tmpdir} by Paddle jobs that no longer run: {left}")
    finally:
        for job in jobs:
            job.end_all()
    for job in jobs:
        assert_nothing_holds_the_environment(job, job.run_dir)
    assert holding_the_environment(tmpdir) == []
