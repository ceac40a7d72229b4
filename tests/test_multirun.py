"""A Hydra multirun over both backends ends with one comparison table."""

from __future__ import annotations

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
