"""dist.max_restarts: a worker that dies no longer ends the job; the framework's launcher
restarts the workers and they continue from the run's latest checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import BACKENDS, FAST, PLANTED, PLANTED_VALUE, holding_the_environment, run_unitrain

JOB = [
    *FAST,
    "trainer.threads=1",
    "dist.nproc_per_node=2",
    "trainer.steps=120",
    "trainer.checkpoint_every=20",
    "trainer.save_final_weights=true",
]


def _steps(run_dir: Path) -> list:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(x) for x in lines[:-1] if '"loss"' in x]  # the last line may be half written


def _weights(run_dir: Path) -> dict:
    with np.load(run_dir / "final_weights.rank0.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_killed_worker_is_restarted_and_the_job_ends_as_if_uninterrupted(backend, tmp_path):
    """torchrun restarts the node's workers; paddle.distributed.launch its pod, in elastic mode
    with an etcd server unitrain starts for the job."""
    if backend == "paddle" and shutil.which("etcd") is None:
        pytest.skip("no etcd server: `make etcd` installs Debian's etcd-server (Paddle restarts only with one)")
    args = [f"backend={backend}", *JOB]
    full = run_unitrain(args, tmp_path / "full")
    assert full.returncode == 0, full.stderr[-2000:]
    run_dir = tmp_path / "restarted" / "run"
    run_dir.parent.mkdir()
    job = subprocess.Popen(
        [sys.executable, "-m", "unitrain", *args, "dist.max_restarts=1", f"hydra.run.dir={run_dir}"],
        cwd=run_dir.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, PLANTED: PLANTED_VALUE},
    )
    deadline = time.monotonic() + 180
    while len(_steps(run_dir)) < 30 and time.monotonic() < deadline:
        assert job.poll() is None, job.communicate()
        time.sleep(0.05)
    victim = json.loads((run_dir / ".workers" / "rank1.json").read_text())["pid"]
    os.kill(victim, signal.SIGKILL)  # as the kernel's OOM killer would
    _, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    restarts = summary["restarts"]
    assert restarts["count"] == 1, restarts
    event = restarts["events"][0]
    assert event["resumed_after_step"] % 20 == 0 and event["reached_step"] >= 30
    assert restarts["steps_repeated"] == event["reached_step"] - event["resumed_after_step"]
    # The same data order from the checkpoint on: every step's loss, and the final weights, bit for bit.
    losses = [(r["step"], r["loss"]) for r in _steps(run_dir)] + []
    full_losses = [(r["step"], r["loss"]) for r in full.metrics()]
    assert losses == full_losses[: len(losses)] and summary["steps"] == 120
    a, b = _weights(run_dir), _weights(full.run_dir)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in b)
    # Paddle's elastic launcher dumps its environment into its pod log: in a private directory.
    assert holding_the_environment(run_dir) == []


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_without_restarts_left_the_job_ends_in_one_line_with_nothing_left_running(backend, tmp_path):
    if backend == "paddle" and shutil.which("etcd") is None:
        pytest.skip("no etcd server: `make etcd` installs Debian's etcd-server (Paddle restarts only with one)")
    run_dir = tmp_path / "run"
    args = [f"backend={backend}", *FAST, "trainer.threads=1", "dist.nproc_per_node=2", "trainer.steps=100000"]
    job = subprocess.Popen(
        [sys.executable, "-m", "unitrain", *args, "trainer.checkpoint_every=20", "dist.max_restarts=1"]
        + [f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed: list = []
    deadline = time.monotonic() + 240
    while len(killed) < 2 and time.monotonic() < deadline:
        assert job.poll() is None, job.communicate()
        time.sleep(0.5)
        try:
            status = json.loads((run_dir / ".workers" / "rank1.json").read_text())
        except (OSError, ValueError):
            continue
        # Killed once it has trained a while in each attempt: the first time, and its restart.
        if status["status"] == "running" and status["pid"] not in killed and time.time() - status["time"] > 5:
            os.kill(status["pid"], signal.SIGKILL)
            killed.append(status["pid"])
    assert len(killed) == 2, "rank 1 was not restarted once"
    _, stderr = job.communicate(timeout=180)
    assert job.returncode == 1
    assert stderr.strip().splitlines()[0].startswith("unitrain: error: rank 1 stopped without reporting"), stderr
    assert stderr.strip().count("\n") == 0, stderr  # one line, pointing at the log that holds the rest
    # The job's own etcd (its data folder is named by the main process's pid), not another
    # test's: the serial tests run two at a time.
    assert _processes_with(str(run_dir)) == [] and _processes_with(f"unitrain-etcd-{job.pid}-") == []


def _processes_with(text: str) -> list:
    """The pids whose command line holds ``text`` (the run directory: launcher and workers)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace"):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return sorted(found)


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_refusal_ends_the_job_at_once_whatever_the_restart_budget(backend, tmp_path):
    """A worker refusing a file is no transient fault: the launcher would restart it into the same
    refusal, dist.max_restarts times over; the job ends at the first, in its one line."""
    if backend == "paddle" and shutil.which("etcd") is None:
        pytest.skip("no etcd server: `make etcd` installs Debian's etcd-server (Paddle restarts only with one)")
    from test_bad_data import RUN, image_folder

    victim = image_folder(tmp_path / "data", "text")
    started = time.monotonic()
    result = run_unitrain(
        [f"backend={backend}", *RUN, f"data.path={tmp_path / 'data'}", "dist.nproc_per_node=2", "dist.max_restarts=50"],
        tmp_path / "job",
        timeout=180,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(victim) in lines[0], lines
    assert time.monotonic() - started < 60
    assert not result.run_dir.exists()  # a refusal leaves nothing behind


@pytest.mark.slow
def test_a_resumed_job_restarted_before_its_first_checkpoint_starts_again_where_it_started(tmp_path):
    """A job that began from another run's checkpoint (trainer.resume) and lost a worker before
    writing one of its own goes back to that checkpoint, not to step 0."""
    args = ["backend=torch", *JOB, "trainer.steps=60"]
    full = run_unitrain(args, tmp_path / "full")
    assert full.returncode == 0, full.stderr[-2000:]
    run_dir = tmp_path / "resumed" / "run"
    run_dir.parent.mkdir()
    resume = f"trainer.resume={full.run_dir / 'checkpoints' / 'step20'}"
    job = subprocess.Popen(
        [sys.executable, "-m", "unitrain", *args, resume, "trainer.checkpoint_every=0", "dist.max_restarts=1"]
        + [f"hydra.run.dir={run_dir}"],
        cwd=run_dir.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while len(_steps(run_dir)) < 30 and time.monotonic() < deadline:
        assert job.poll() is None, job.communicate()
        time.sleep(0.05)
    os.kill(json.loads((run_dir / ".workers" / "rank1.json").read_text())["pid"], signal.SIGKILL)
    _, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stderr[-3000:]
    event = json.loads((run_dir / "summary.json").read_text())["restarts"]["events"][0]
    assert event["resumed_after_step"] == 20 and event["reached_step"] >= 30
    a, b = _weights(run_dir), _weights(full.run_dir)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in b)
