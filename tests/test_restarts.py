"""dist.max_restarts: a worker that dies no longer ends the job; the framework's launcher
restarts the workers and they continue from the run's latest checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import FAST, run_unitrain

JOB = [
    "backend=torch",
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
def test_a_killed_worker_is_restarted_by_torchrun_and_the_job_ends_as_if_uninterrupted(tmp_path):
    full = run_unitrain(JOB, tmp_path / "full")
    assert full.returncode == 0, full.stderr[-2000:]
    run_dir = tmp_path / "restarted" / "run"
    run_dir.parent.mkdir()
    job = subprocess.Popen(
        [sys.executable, "-m", "unitrain", *JOB, "dist.max_restarts=1", f"hydra.run.dir={run_dir}"],
        cwd=run_dir.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
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
