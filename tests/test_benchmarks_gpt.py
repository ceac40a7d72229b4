"""benchmarks/gpt.py, the language-model benchmark: a file of its own, so that the slow suite's
workers share it and test_benchmarks.py's quick run between them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


@pytest.mark.slow
def test_gpt_harness_pairs_unitrain_with_the_hand_written_scripts_and_draws_the_loss_curve(tmp_path):
    """benchmarks/gpt.py on a small corpus: one pair per framework, where the hand-written script
    builds a GPT of exactly unitrain's size from its own reading of the corpus, and the loss
    curve of both frameworks with its plot and time to target (timings are not checked)."""
    corpus = tmp_path / "corpus.txt"
    line = "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    corpus.write_text((line + "must be in want of a wife.\n") * 200)
    script = HARNESS.parent / "gpt.py"
    common = ["--corpus", str(corpus)]
    speed = subprocess.run(
        [
            sys.executable,
            str(script),
            "speed",
            *common,
            "--pairs",
            "1",
            "--steps",
            "3",
            "--warmup",
            "1",
            # Beside the suite's other worker every pair counts as disturbed: retried, each is run three times.
            "--retries",
            "0",
            # The reference's code path, on matrices that take a moment rather than seconds of both cores.
            "--sgemm-size",
            "256",
            "--out",
            str(tmp_path / "speed"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert speed.returncode == 0, speed.stdout[-2000:] + speed.stderr[-3000:]
    record = json.loads((tmp_path / "speed" / "gpt.json").read_text())
    for backend in ("torch", "paddle"):
        (pair,) = record["runs"][backend]
        unitrain, written = pair["unitrain"]["detail"], pair["handwritten"]["detail"]
        assert unitrain["parameters"] == written["parameters"], backend
        assert unitrain["steps"] == written["steps"] == 4, backend
        summary = record["summary"][backend]
        assert pair["ratio"] > 0 and 0 < summary["unitrain"]["mfu"] < 1 and 0 < summary["handwritten"]["mfu"] < 1
    assert record["peak"]["sgemm_size"] == 256 and record["peak"]["sgemm_gflops"] > 0
    assert record["peak"]["peak_gflops"] > 0 and "| torch" in (tmp_path / "speed" / "gpt.md").read_text()
    loss = subprocess.run(
        [
            sys.executable,
            str(script),
            "loss",
            *common,
            "--steps",
            "4",
            "--eval-every",
            "2",
            # Each evaluation's forward passes: char_gpt's 500 windows are for a curve worth reading.
            "--val-samples",
            "64",
            "--out",
            str(tmp_path / "loss"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert loss.returncode == 0, loss.stdout[-2000:] + loss.stderr[-3000:]
    curves = json.loads((tmp_path / "loss" / "gpt_loss.json").read_text())
    assert [[e["step"] for e in r["curve"]] for r in curves["runs"].values()] == [[2, 4], [2, 4]]
    assert all(r["reached"] for r in curves["runs"].values())  # the target is one both reach
    assert (tmp_path / "loss" / "gpt_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "time to loss" in (tmp_path / "loss" / "comparison.md").read_text()
