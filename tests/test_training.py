"""Both backends train through `python -m unitrain`, as a user runs it."""

from __future__ import annotations

import math

import pytest

from conftest import BACKENDS, FAST


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_model_learns_on_learnable_data(backend, unitrain_cli):
    result = unitrain_cli(f"backend={backend}", *FAST, "trainer.steps=30", "optim.lr=0.05")
    assert result.returncode == 0, result.stderr
    records = result.metrics()
    assert [r["step"] for r in records] == list(range(1, 31))
    first = sum(r["loss"] for r in records[:3]) / 3
    last = sum(r["loss"] for r in records[-5:]) / 5
    assert last < 0.5 * first, (first, last)
    assert sum(r["top1"] for r in records[-5:]) / 5 > 0.5

    summary = result.summary()
    assert (
        summary["backend"] == backend and summary["framework"] == {"paddle": "paddlepaddle", "torch": "torch"}[backend]
    )
    assert summary["steps"] == 30 and summary["model"] == "tiny" and summary["device"] == "cpu"
    assert summary["precision"]["requested"] == "O0 float32" and summary["precision"]["effective"] == "fp32"
    assert summary["threads"] == 1  # FAST's
    assert summary["malloc"]["mode"] == "fixed" and summary["malloc"]["applied"] is True  # Linux, glibc
    assert summary["throughput"]["samples_per_s"] > 0
    assert math.isclose(summary["final"]["loss"], sum(r["loss"] for r in records[-10:]) / 10)
    # The table a user came for, printed at the end.
    assert f"| {backend} | tiny | O0 float32 | fp32 | 1 | 16 |" in result.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_step_metrics_hold_what_the_issue_lists(backend, unitrain_cli):
    result = unitrain_cli(f"backend={backend}", *FAST, "trainer.steps=4", "optim.lr=0.1", "optim.warmup_steps=4")
    assert result.returncode == 0, result.stderr
    records = result.metrics()
    for key in ("loss", "top1", "top5", "lr", "reader_cost", "batch_cost", "ips", "cpu_cost", "epoch", "step"):
        assert key in records[0], key
    assert all(r["cpu_cost"] > 0 for r in records)
    assert [r["lr"] for r in records] == pytest.approx([0.025, 0.05, 0.075, 0.1])
    assert all(0 <= r["top1"] <= r["top5"] <= 1 for r in records)
    assert all(r["batch_cost"] >= r["reader_cost"] >= 0 for r in records)


@pytest.mark.parametrize("backend", BACKENDS)
def test_thread_count_is_applied(backend, unitrain_cli):
    result = unitrain_cli(f"backend={backend}", *FAST, "trainer.steps=2", "trainer.threads=2")
    assert result.returncode == 0, result.stderr
    assert result.summary()["threads"] == 2


def test_epochs_and_imagefolder(unitrain_cli, tmp_path):
    from test_data import _write_images

    _write_images(tmp_path / "images", ["a", "b"], 5)
    result = unitrain_cli(
        "backend=torch",
        *FAST,
        "data=imagefolder",
        f"data.path={tmp_path / 'images'}",
        "data.image_size=16",
        "trainer.batch_size=4",
        "trainer.steps=null",
        "trainer.epochs=2",
    )
    assert result.returncode == 0, result.stderr
    records = result.metrics()
    # 10 images, batch 4, drop_last: 2 batches per epoch.
    assert [(r["epoch"], r["step"]) for r in records] == [(0, 1), (0, 2), (1, 3), (1, 4)]
    assert result.summary()["num_classes"] == 2


# Slow by the fast suite's budget (loader worker processes starting): make test under 12 minutes.
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_loader_workers_give_the_same_training(backend, unitrain_cli, tmp_path):
    from conftest import run_unitrain

    inline = run_unitrain([f"backend={backend}", *FAST, "trainer.steps=4", "data.num_workers=0"], tmp_path / "inline")
    workers = run_unitrain([f"backend={backend}", *FAST, "trainer.steps=4", "data.num_workers=2"], tmp_path / "workers")
    assert inline.returncode == 0 and workers.returncode == 0, workers.stderr[-2000:]
    # Samples are functions of their index, so loader processes change nothing but speed.
    assert [r["loss"] for r in workers.metrics()] == pytest.approx([r["loss"] for r in inline.metrics()], rel=1e-5)
