"""No process outlives its job: real data-parallel runs, real signals to the main process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Set

import pytest

from conftest import BACKENDS, FAST, alive, descendants

# Each times how soon its job ends: after the slow tests that run four at a time (make test-slow's serial part).
pytestmark = [pytest.mark.slow, pytest.mark.serial]


def worker_pids(run_dir: Path) -> Set[int]:
    folder = run_dir / ".workers"
    return {json.loads(f.read_text())["pid"] for f in folder.glob("rank*.json")} if folder.exists() else set()


def as_a_terminal_job() -> None:
    """SIGINT as a terminal's foreground job has it. Where the suite itself was started in the
    background by a non-interactive shell (``make test &``, some CI runners), SIGINT arrives
    ignored, the ignore is inherited across exec, and Python then installs no Ctrl-C handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_unitrain(args: List[str], tmp_path: Path) -> subprocess.Popen:
    # A session of its own, as a shell gives each job a process group: Ctrl-C and a closed
    # terminal signal the whole group, as killpg does here.
    return subprocess.Popen(
        [sys.executable, "-m", "unitrain", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
        preexec_fn=as_a_terminal_job,
    )


def wait_until_training(proc: subprocess.Popen, metrics: Path, workers: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if len(worker_pids(metrics.parent)) >= workers and metrics.exists() and metrics.read_text().count("\n") >= 5:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.3)
    raise AssertionError("the job did not start training in time")


def one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("unitrain: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return errors[0]


def end_all(proc: subprocess.Popen, pids: Set[int]) -> None:
    """Whatever a failed assertion left behind."""
    for pid in alive(pids | descendants(proc.pid) | {proc.pid}):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.communicate()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_signal_to_the_main_process_leaves_no_process_behind(backend, sig, tmp_path):
    run_dir = tmp_path / "run"
    args = [
        f"backend={backend}",
        *FAST,
        "trainer.threads=1",
        "dist.nproc_per_node=2",
        "trainer.steps=100000",
        f"hydra.run.dir={run_dir}",
    ]
    proc = start_unitrain(args, tmp_path)
    tree: Set[int] = set()
    try:
        wait_until_training(proc, run_dir / "metrics.jsonl", workers=2)
        tree = descendants(proc.pid) | worker_pids(run_dir)
        assert len(tree) >= 3  # the launcher and two workers (torchrun may add helpers)
        if sig in (signal.SIGINT, signal.SIGHUP):
            os.killpg(proc.pid, sig)  # Ctrl-C, a closed terminal: the foreground process group
        else:
            proc.send_signal(sig)  # kill, timeout, a scheduler: the process
        _, stderr = proc.communicate(timeout=60)
        deadline = time.monotonic() + 20
        while alive(tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(tree), f"left running after {sig.name}: {alive(tree)}"
        if sig == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL
        else:
            assert proc.returncode == 128 + sig
            expected = "interrupted (Ctrl-C)" if sig == signal.SIGINT else f"stopped by {sig.name}"
            assert expected in one_error_line(stderr)
    finally:
        end_all(proc, tree)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ctrl_c_in_a_sweep_is_one_line(backend, tmp_path):
    # A sweep job trains in a child of the main process, in the terminal's process group: it
    # gets the Ctrl-C too, and must not print a traceback of its own.
    sweep = tmp_path / "multirun"
    proc = start_unitrain(
        ["-m", f"backend={backend}", *FAST, "trainer.threads=1", "trainer.steps=100000", f"hydra.sweep.dir={sweep}"],
        tmp_path,
    )
    tree: Set[int] = set()
    try:
        wait_until_training(proc, sweep / f"0_{backend}_O0" / "metrics.jsonl", workers=1)
        tree = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 130
        assert "interrupted (Ctrl-C)" in one_error_line(stderr)
        assert not alive(tree)
    finally:
        end_all(proc, tree)


@pytest.mark.parametrize("backend,node_rank", [("paddle", 0), ("torch", 0), ("torch", 1)])
def test_a_node_that_never_comes_times_out_in_one_line(backend, node_rank, tmp_path):
    from unitrain.host.ports import free_port

    port = free_port()
    args = [
        f"backend={backend}",
        *FAST,
        "trainer.threads=1",
        "dist.nnodes=2",
        f"dist.node_rank={node_rank}",
        f"dist.master_port={port}",
        "dist.timeout_s=5",
    ]
    started = time.monotonic()
    proc = start_unitrain([*args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    tree: Set[int] = set()
    try:
        while proc.poll() is None and time.monotonic() - started < 60:
            tree |= descendants(proc.pid)  # the launcher, once started
            time.sleep(0.2)
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 2, stderr[-3000:]
        waiting = [line for line in (stdout + stderr).splitlines() if "waiting up to 5s (dist.timeout_s)" in line]
        assert len(waiting) == 1 and f"for all 2 nodes to join at 127.0.0.1:{port}" in waiting[0]
        error = one_error_line(stderr)
        assert "dist.nnodes=2: the other node(s) did not join" in error and "dist.timeout_s=5s" in error, error
        assert time.monotonic() - started < 45
        if backend == "torch":
            # torchrun's own rendezvous timeout ended it (--rdzv-conf timeout), not the main process.
            launcher_log = (tmp_path / "run" / "launcher.log").read_text()
            assert ("waiting for clients" if node_rank == 0 else "client socket has timed out") in launcher_log
        time.sleep(1)
        assert tree and not alive(tree)
    finally:
        end_all(proc, tree)


def run_with_port(backend: str, port: int, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "unitrain",
            f"backend={backend}",
            *FAST,
            "trainer.steps=2",
            "trainer.threads=1",
            "dist.nproc_per_node=2",
            f"dist.master_port={port}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_busy_master_port_is_one_line(backend, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_with_port(backend, port, tmp_path)
    assert proc.returncode == 2
    line = one_error_line(proc.stderr)
    assert (
        f"dist.master_port={port} is not allowed: it is in use" in line
        and "pick a free port, or leave it unset" in line
    )
    assert not (tmp_path / "run" / "launcher.log").exists()  # refused before the launcher started


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_master_port_taken_after_the_check_is_one_line(backend, tmp_path):
    # Another program takes the port between unitrain's check and the launcher's bind: the
    # launcher's own failure (torchrun's EADDRINUSE, Paddle's aborted store) becomes the same line.
    from unitrain.host.ports import free_port

    port, run_dir = free_port(), tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "unitrain",
            f"backend={backend}",
            *FAST,
            "trainer.steps=2",
            "trainer.threads=1",
            "dist.nproc_per_node=2",
            f"dist.master_port={port}",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    tree: Set[int] = set()
    try:
        # Written after the check, before the launcher starts (which takes seconds to import).
        while not (run_dir / "worker_config.yaml").exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.01)
        with socket.socket() as thief:
            thief.bind(("127.0.0.1", port))
            thief.listen()
            while proc.poll() is None:
                tree |= descendants(proc.pid) | worker_pids(run_dir)
                time.sleep(0.1)
            _, stderr = proc.communicate()
        assert proc.returncode == 2, stderr[-3000:]
        assert f"dist.master_port={port} is not allowed: it is in use" in one_error_line(stderr)
        assert tree  # the launcher did start (its processes were seen)
        # A refusal leaves nothing: the launcher's log went with the run directory it started.
        assert not run_dir.exists() and not alive(tree)
    finally:
        end_all(proc, tree)
