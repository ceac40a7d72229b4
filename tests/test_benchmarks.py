"""The benchmark harness runs on a tiny configuration and writes its files (timings are not checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


@pytest.mark.slow
def test_quick_benchmark_writes_json_and_markdown(tmp_path):
    proc = subprocess.run([sys.executable, str(HARNESS), "--quick", "--repeats", "1", "--pairs", "1", "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["backend"] for r in results["overhead"]] == ["paddle", "paddle", "torch", "torch"]
    for row in results["overhead"]:
        assert row["model"] == "resnet18" and row["unitrain_startup_s"] > 0 and row["native_startup_s"] > 0
        assert row["ratio_ci"][0] <= row["ratio"] <= row["ratio_ci"][1] and row["cpu_ratio_ci"][0] <= row["cpu_ratio"] <= row["cpu_ratio_ci"][1]
    assert results["machine"]["extensions"]
    assert len(results["data"]) == 8 and {r["workers"] for r in results["data"]} == {0, 2}
    variants = {(r["backend"], r["variant"]) for r in results["scaling"]}
    for backend in ("paddle", "torch"):
        assert {(backend, "default"), (backend, "no all-reduce (2 independent jobs)"), (backend, "bucket_cap_mb=5")} <= variants
    assert ("torch", "grad_compression=fp16") in variants
    assert all(r["buckets"] for r in results["scaling"] if r["variant"] == "bucket_cap_mb=5")
    # backend.tuned=true gets a scaling row only where it applies something: never torch on a CPU.
    tuned_scaling = [r for r in results["scaling"] if r["variant"].startswith("backend.tuned=true")]
    assert all(r["backend"] == "paddle" and "MKL" in r["variant"] and r["ips_1x1"] > 0 for r in tuned_scaling), tuned_scaling
    assert [r["grad_compression"] for r in results["compression"]] == ["none", "fp16"]
    assert all(0 <= r["val_top1"] <= 1 for r in results["compression"])
    tuned = {(r["backend"], r["variant"]): r["applied"] for r in results["tuned"]}
    assert tuned[("torch", "compile,channels_last")] and tuned[("paddle", "to_static")], tuned
    assert [r["backend"] for r in results["maxbatch"]] == ["paddle", "torch"] and all(r["max_batch_size"] >= 64 for r in results["maxbatch"])
    assert {r["model"] for r in results["loop"]} == {"resnet18"} and {r["backend"] for r in results["loop"]} == {"paddle", "torch"}
    amp = {(r["backend"], r["amp"]): r["effective"] for r in results["amp"]}
    assert amp[("paddle", "O2")] == "fp32" and amp[("torch", "O2")] == "O2 bfloat16"
    text = (tmp_path / "results.md").read_text()
    for heading in ("## Overhead", "## The loop alone", "## Start-up", "## Data loading", "## Data-parallel scaling", "## What fp16 gradient compression costs",
                    "## Each framework at its best", "## Largest batch that fits", "## Mixed precision"):
        assert heading in text


def test_bn_variance_reproduces_paddles_held_out_result_and_times_the_correction(tmp_path):
    """A Paddle run's checkpoint, evaluated in torch with the running variance it recorded
    (torch's unbiased one since unitrain's Paddle models follow it), gives Paddle's own held-out
    result; the biased definition gives another loss. The cost section runs and writes its files."""
    from conftest import FAST, run_unitrain

    run = run_unitrain(["backend=paddle", *FAST, "trainer.batch_size=4", "trainer.steps=30", "data.val_samples=64", "trainer.checkpoint_every=30"], tmp_path / "job")
    assert run.returncode == 0, run.stderr[-2000:]
    script = str(HARNESS.parent / "bn_variance.py")
    proc = subprocess.run([sys.executable, script, "accuracy", str(run.run_dir), "--out", str(tmp_path / "acc")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads((tmp_path / "acc" / "results.json").read_text())["rows"]
    held_out = run.summary()["eval"]
    assert row["step"] == 30 and row["smallest_n"] == 4  # batch 4, 1x1 maps in the last stages
    assert abs(row["unbiased"]["val_loss"] - held_out["val_loss"]) < 1e-4 and row["unbiased"]["val_top1"] == held_out["val_top1"]
    assert abs(row["biased"]["val_loss"] - row["unbiased"]["val_loss"]) > 1e-4
    proc = subprocess.run([sys.executable, script, "cost", "--quick", "--steps", "2", "--out", str(tmp_path / "cost")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (cost,) = json.loads((tmp_path / "cost" / "cost.json").read_text())["rows"]
    assert cost["model"] == "tiny 16x16 batch 8" and cost["wall_ratio"][1] <= cost["wall_ratio"][0] <= cost["wall_ratio"][2]
    assert "| tiny 16x16 batch 8 |" in (tmp_path / "cost" / "cost.md").read_text()


@pytest.mark.slow
def test_malloc_benchmark_runs_all_four_variants_and_writes_their_ratios(tmp_path):
    script = HARNESS.parent / "malloc.py"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--pairs", "1", "--backend", "paddle", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["backend"] == "paddle" and results["model"] == "resnet18" and results["pairs"] == 1
    assert set(results["step_ms"]) == {"unitrain dynamic", "native dynamic", "unitrain fixed", "native fixed"}
    assert all(v > 0 for v in results["step_ms"].values())
    assert [r["ratio"] for r in results["ratios"]][1] == "unitrain fixed / native fixed"
    assert all(r["ci"][0] <= r["median"] <= r["ci"][1] for r in results["ratios"])
    assert "| unitrain fixed / native fixed |" in (tmp_path / "results.md").read_text()


@pytest.mark.slow
def test_overhead_rows_can_be_measured_alone_and_a_wrong_one_is_named(tmp_path):
    args = [sys.executable, str(HARNESS), "--quick", "--sections", "overhead", "--backends", "torch", "--pairs", "1", "--out", str(tmp_path)]
    proc = subprocess.run([*args, "--layouts", "2x1", "--models", "resnet18"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "results.json").read_text())["overhead"]
    assert [(r["model"], r["backend"], r["processes"], r["threads"]) for r in rows] == [("resnet18", "torch", 2, 1)]
    assert "resnet18 torch 2x1 pair 1/1: unitrain" in proc.stdout  # a long row shows each pair as it ends
    wrong = subprocess.run([*args, "--layouts", "3x1"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "3x1 is not allowed" in wrong.stderr and "--layouts takes 1x2, 2x1" in wrong.stderr
