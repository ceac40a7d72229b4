"""A Hydra multirun over both backends ends with one comparison table."""

from __future__ import annotations

import pytest

from conftest import FAST


def test_multirun_over_backends_prints_one_table(unitrain_cli, tmp_path):
    result = unitrain_cli("-m", "backend=paddle,torch", *FAST, "trainer.steps=3")
    assert result.returncode == 0, result.stderr
    table = (tmp_path / "multirun" / "comparison.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| paddle") or line.startswith("| torch")]
    assert [r.split("|")[1].strip() for r in rows] == ["paddle", "torch"]
    assert table.splitlines()[0] in result.stdout and rows[0] in result.stdout
    for job in ("0_paddle_O0", "1_torch_O0"):
        assert (tmp_path / "multirun" / job / "summary.json").exists()


@pytest.mark.slow
def test_a_sweep_with_a_failing_job_reports_the_others_names_the_failure_and_exits_non_zero(unitrain_cli, tmp_path):
    """Before: the failing job's error printed twice, exit 2 (the job alone exits 1), and no
    table for the job that had finished."""
    result = unitrain_cli("-m", "backend=torch", *FAST, "trainer.steps=3", "optim.lr=0.01,1e29")
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("the loss is nan") == 1
    table = (tmp_path / "multirun" / "comparison.md").read_text()
    assert [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| torch")] == ["torch"]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("unitrain: error: 1 job(s) of the sweep failed: #1 (exit 1: ") and "1_torch_O0" in last
    assert (tmp_path / "multirun" / "0_torch_O0" / "summary.json").exists()
