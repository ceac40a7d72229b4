"""Data parallel on both backends through their own launchers (gloo, 2 workers on CPU).

Tolerances: the 2-worker and the 1-worker runs see the same samples per step, but their
gradients are summed in a different order (two half-batch means all-reduced vs one mean),
so they agree to fp32 rounding, not bit for bit. After 4 momentum steps on the tiny model
that is well inside atol 1e-5 / rtol 1e-4; a real mistake (other samples, unscaled lr,
missing all-reduce) moves parameters by 1e-3 and more. BatchNorm is frozen (model.freeze_bn)
because batch statistics over 8 samples differ from those over 16 by design.
"""

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

from conftest import BACKENDS, DP_JOB, FAST, holding_the_environment, run_unitrain

pytestmark = pytest.mark.slow


def weights(run_dir: Path, rank: int = 0) -> dict:
    with np.load(run_dir / f"final_weights.rank{rank}.npz") as f:
        return {k: f[k] for k in f.files}


def assert_close(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-5, err_msg=key)


def assert_differs(a: dict, b: dict):
    assert any(not np.allclose(a[k], b[k], rtol=1e-4, atol=1e-5) for k in a)


# What the frameworks print while a job starts: it belongs in workerlog.N, not on the screen.
FRAMEWORK_NOISE = (
    "topology.py",
    "is not in group",
    "warnings.warn",
    "FLAGS",
    "tcp_store.cc",
    "distributed_strategy.py",
    "OMP_NUM_THREADS",
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_workers_equal_one_worker_with_the_doubled_batch(backend, dp_run):
    one, two = dp_run(backend, 1), dp_run(backend, 2)
    port = next(a for a in two.args if a.startswith("dist.master_port=")).split("=")[1]
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr[-3000:]

    summary = two.summary()
    assert (summary["world_size"], summary["batch_size"], summary["global_batch_size"]) == (2, 8, 16)
    assert summary["comm_backend"] == "gloo" and summary["ranks_in_sync"] is True
    # Parameters identical across ranks, bit for bit.
    rank0, rank1 = weights(two.run_dir, 0), weights(two.run_dir, 1)
    assert all(np.array_equal(rank0[k], rank1[k]) for k in rank0)
    # Same samples, same lr, averaged gradients: the same training as one process on 2B.
    assert_close(rank0, weights(one.run_dir))
    # The logged loss is the mean over ranks, i.e. the loss of the whole batch.
    np.testing.assert_allclose([r["loss"] for r in two.metrics()], [r["loss"] for r in one.metrics()], rtol=1e-4)
    # Each rank wrote its log where Paddle's launcher would; the main process showed rank 0's.
    assert (two.run_dir / "workerlog.0").exists() and (two.run_dir / "workerlog.1").exists()
    assert "[rank 0] " in two.stdout and "| 2 | 16 |" in two.stdout
    # The frameworks' start-up output stays in the logs; the user sees unitrain's lines only.
    echoed = [line[len("[rank 0] ") :] for line in two.stdout.splitlines() if line.startswith("[rank 0] ")]
    assert echoed[0].startswith("[") and "][unitrain][INFO] - " in echoed[0] and "(rank 0 of 2)" in echoed[0], (
        two.stdout
    )
    # The step timer's table is detail: in rank 0's log, not on the console.
    assert "Perf Summary" not in two.stdout and "Perf Summary" in (two.run_dir / "workerlog.0").read_text()
    assert [n for n in FRAMEWORK_NOISE if n in two.stdout + two.stderr] == []
    # Tokens live in the environment: no file of the run holds it (Paddle's launcher writes
    # every worker's environment into its log directory, which is a private one, removed).
    assert holding_the_environment(two.run_dir) == [] and not list(two.run_dir.glob("envlog.*"))
    if backend == "paddle":
        log0 = (two.run_dir / "workerlog.0").read_text()
        assert "topology.py" in log0 and "is not in group" in log0  # the file keeps everything
        # On one node too, Paddle's workers meet at dist.master_port (the launcher says where).
        assert f"127.0.0.1:{port}" in (two.run_dir / "launcher.log").read_text()


@pytest.mark.parametrize("backend", BACKENDS)
def test_accumulation_equals_one_step_on_the_doubled_batch(backend, tmp_path, dp_run):
    whole = dp_run(backend, 1)
    accumulated = run_unitrain([f"backend={backend}", *DP_JOB, "trainer.accumulate_steps=2"], tmp_path / "acc")
    assert whole.returncode == 0 and accumulated.returncode == 0, whole.stderr + accumulated.stderr
    assert accumulated.summary()["batch_size"] == 8 and accumulated.summary()["accumulate_steps"] == 2
    assert_close(weights(accumulated.run_dir), weights(whole.run_dir))


@pytest.mark.parametrize("backend", BACKENDS)
def test_accumulation_in_data_parallel_skips_nothing(backend, tmp_path, dp_run):
    # 2 workers x 2 micro-steps of 4 == 1 worker with 16; no_sync on the first micro-step must
    # not lose its gradient.
    whole = dp_run(backend, 1)
    both = run_unitrain(
        [f"backend={backend}", *DP_JOB, "trainer.accumulate_steps=2", "dist.nproc_per_node=2"], tmp_path / "both"
    )
    assert whole.returncode == 0 and both.returncode == 0, both.stderr[-3000:]
    assert_close(weights(both.run_dir), weights(whole.run_dir))


def test_linear_lr_scaling_keeps_the_per_device_batch(tmp_path):
    result = run_unitrain(
        ["backend=torch", *FAST, "trainer.steps=2", "trainer.batch_size=8", "optim.lr=0.05", "dist.nproc_per_node=2"],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    s = result.summary()
    assert (s["batch_size"], s["global_batch_size"], s["lr"], s["lr_scaling"]) == (8, 16, 0.1, "linear")
    assert result.metrics()[0]["lr"] == pytest.approx(0.1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sync_bn_on_cpu_is_refused_in_one_line(backend, tmp_path):
    result = run_unitrain(
        [f"backend={backend}", *FAST, "trainer.steps=2", "dist.nproc_per_node=2", "dist.sync_bn=true"], tmp_path
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("unitrain: error: dist.sync_bn=True is not allowed: false on cpu")
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose; /proc says so.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _processes_mentioning(text: str) -> list:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and _alive(int(entry.name)):
                found.append((int(entry.name), cmdline))
    return found


def _start_training(backend: str, run_dir: Path) -> tuple:
    cmd = [
        sys.executable,
        "-m",
        "unitrain",
        f"backend={backend}",
        *FAST,
        "trainer.steps=100000",
        "trainer.log_every=1",
        "dist.nproc_per_node=2",
        "trainer.threads=1",
        f"hydra.run.dir={run_dir}",
    ]
    main = subprocess.Popen(cmd, cwd=run_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").read_text().count("\n") >= 3:
            break
        assert main.poll() is None, main.communicate()
        time.sleep(0.2)
    statuses = {s["rank"]: s for s in (json.loads(f.read_text()) for f in (run_dir / ".workers").glob("rank*.json"))}
    assert set(statuses) == {0, 1}
    return main, statuses


def _end(main: subprocess.Popen, statuses: dict) -> None:
    for pid in (s["pid"] for s in statuses.values()):
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    if main.poll() is None:
        main.kill()
        main.communicate()


@pytest.mark.serial
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("victim", [1, 0])
def test_killing_a_worker_ends_the_job_and_leaves_nothing(backend, victim, tmp_path):
    run_dir, other = tmp_path / "run", 1 - victim
    main, statuses = _start_training(backend, run_dir)
    try:
        os.kill(statuses[victim]["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        out, err = main.communicate(timeout=90)
        took = time.monotonic() - killed_at
    finally:
        _end(main, statuses)
    assert main.returncode not in (0, None)
    assert took < 60
    assert err.startswith(f"unitrain: error: rank {victim} stopped without reporting"), err[-3000:]
    # The innocent rank is named as what it is, and the log shown is the dead rank's.
    assert f"rank {other} stopped without reporting" not in err and f"rank {other} failed" not in err, err[-3000:]
    assert f"rank(s) {other} " in err.splitlines()[0]
    assert err.splitlines()[0].endswith(f"; see {run_dir / f'workerlog.{victim}'}") and err.count("\n") == 1, err
    assert not [p for p in (s["pid"] for s in statuses.values()) if _alive(p)]
    assert _processes_mentioning(str(run_dir)) == []


@pytest.mark.serial
def test_a_rank_stuck_when_another_dies_is_not_blamed(tmp_path):
    # Rank 0 cannot act on anything (as when blocked in a collective); rank 1 is killed. Both
    # end without a word, rank 0 only when the launcher gives up on it and kills it: the one
    # that went first is named, with its log.
    run_dir = tmp_path / "run"
    main, statuses = _start_training("paddle", run_dir)
    try:
        os.kill(statuses[0]["pid"], signal.SIGSTOP)
        time.sleep(0.5)
        os.kill(statuses[1]["pid"], signal.SIGKILL)
        out, err = main.communicate(timeout=90)
    finally:
        _end(main, statuses)
    assert main.returncode not in (0, None)
    first = err.splitlines()[0]
    assert first.startswith("unitrain: error: rank 1 stopped without reporting") and "rank 0 stopped" not in first, err[
        -3000:
    ]
    assert "rank(s) 0 ended after it" in first
    assert first.endswith(f"; see {run_dir / 'workerlog.1'}") and err.count("\n") == 1, err
    assert not [p for p in (s["pid"] for s in statuses.values()) if _alive(p)]


def test_multirun_over_both_backends_in_data_parallel(tmp_path):
    result = run_unitrain(
        ["-m", "backend=paddle,torch", *FAST, "trainer.steps=3", "dist.nproc_per_node=2", "trainer.threads=1"], tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (tmp_path / "multirun" / "comparison.md").read_text().splitlines()
    header = next([c.strip() for c in line.split("|")] for line in lines if line.startswith("| backend"))
    rows = [
        dict(zip(header, (c.strip() for c in line.split("|"))))
        for line in lines
        if line.startswith(("| paddle", "| torch"))
    ]
    assert [(r["backend"], r["world"]) for r in rows] == [("paddle", "2"), ("torch", "2")]


@pytest.mark.parametrize(
    "backend,launcher", [("paddle", "paddle.distributed.launch"), ("torch", "torch.distributed.run")]
)
def test_library_collectives_under_the_frameworks_launchers(backend, launcher, tmp_path):
    probe = Path(__file__).with_name("collectives_probe.py")
    extra = ["--log_dir", str(tmp_path / "logs")] if backend == "paddle" else []
    proc = subprocess.run(
        [sys.executable, "-m", launcher, "--nproc_per_node", "2", *extra, str(probe), backend],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("{"))
    assert json.loads(line) == {"broadcast": {"from": 1, "items": [1, 2]}, "mean": 1.5, "max": [1.0, 10.0]}
