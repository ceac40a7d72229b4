"""No process outlives its job: real data-parallel runs, real signals to the main process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Set

import pytest

from conftest import BACKENDS, FAST

pytestmark = pytest.mark.slow


def descendants(pid: int) -> Set[int]:
    """Every process below ``pid`` (children, grandchildren...), from /proc."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = {int(c) for c in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += list(children - found)
            found |= children
    return found


def alive(pids: Set[int]) -> Set[int]:
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z":  # a zombie has ended; only its parent has not collected it yet
            left.add(pid)
    return left


def start_training(backend: str, tmp_path: Path, *extra: str) -> subprocess.Popen:
    run_dir = tmp_path / "run"
    args = [f"backend={backend}", *FAST, "trainer.threads=1", "dist.nproc_per_node=2", "trainer.steps=100000", *extra, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "unitrain", *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        statuses = [json.loads(f.read_text()) for f in (run_dir / ".workers").glob("rank*.json")] if (run_dir / ".workers").exists() else []
        metrics = run_dir / "metrics.jsonl"
        if len(statuses) == 2 and metrics.exists() and metrics.read_text().count("\n") >= 10:
            return proc
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.3)
    proc.kill()
    raise AssertionError("the job did not start training in time")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_signal_to_the_main_process_leaves_no_process_behind(backend, sig, tmp_path):
    proc = start_training(backend, tmp_path)
    tree = descendants(proc.pid)
    try:
        assert len(tree) >= 3  # the launcher and two workers (torchrun may add helpers)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
        deadline = time.monotonic() + 20
        while alive(tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(tree), f"left running after {sig.name}: {alive(tree)}"
        if sig == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL
        else:
            assert proc.returncode == 128 + sig
            errors = [line for line in stderr.splitlines() if line.startswith("unitrain: error:")]
            assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
            expected = "interrupted (Ctrl-C)" if sig == signal.SIGINT else f"stopped by {sig.name}"
            assert expected in errors[0]
    finally:
        for pid in alive(tree | {proc.pid}):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_node_that_never_comes_times_out_in_one_line(backend, tmp_path):
    from unitrain.launch import free_port

    args = [f"backend={backend}", *FAST, "trainer.threads=1", "dist.nnodes=2", f"dist.master_port={free_port()}", "dist.timeout_s=6"]
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "unitrain", *args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(3)
    tree = descendants(proc.pid)
    stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 2, stderr[-3000:]
    assert "waiting up to 6s (dist.timeout_s) for all 2 nodes" in stdout + stderr
    errors = [line for line in stderr.splitlines() if line.startswith("unitrain: error:")]
    assert len(errors) == 1 and "did not join" in errors[0] and "dist.timeout_s=6s" in errors[0], stderr[-3000:]
    assert time.monotonic() - started < 60
    time.sleep(1)
    assert not alive(tree)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_busy_master_port_is_one_line(backend, tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "unitrain", f"backend={backend}", *FAST, "trainer.steps=2", "trainer.threads=1", "dist.nproc_per_node=2",
             f"dist.master_port={port}", f"hydra.run.dir={tmp_path / 'run'}"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    if backend == "torch":
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        (line,) = [x for x in proc.stderr.splitlines() if x.startswith("unitrain: error:")]
        assert f"dist.master_port={port} is not allowed: it is in use" in line
    else:
        # Paddle's launcher picks its own port on one node: the run goes on, and says so.
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"dist.master_port={port} is not used" in proc.stdout + proc.stderr
