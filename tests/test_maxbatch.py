"""python -m unitrain.maxbatch: the largest batch under a memory limit on the CPU, found by real
trials (doubling, then bisecting), and one line for what cannot be searched."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def maxbatch(*args: str, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "unitrain.maxbatch", *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )


@pytest.mark.slow
def test_the_search_ends_between_a_batch_that_fits_and_the_next_that_does_not(tmp_path):
    # The tiny model on 64x64 images: a torch process peaks at about 0.4 GB at batch 256 and
    # each further sample adds about 0.3 MB, so an 800 MiB limit is reached between 1024 and 2048.
    out = tmp_path / "search"
    proc = maxbatch(
        "--memory-limit",
        "800MiB",
        "--start",
        "256",
        "--max",
        "8192",
        "--resolution",
        "256",  # two halvings after the first failure: each trial is a process of its own
        "--out",
        str(out),
        "backend=torch",
        "model=tiny",
        "data.image_size=64",
        "trainer.threads=2",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((out / "maxbatch.json").read_text())
    best, trials = result["max_batch_size"], result["trials"]
    fits = {t["batch_size"] for t in trials if t["fits"]}
    fails = {t["batch_size"] for t in trials if not t["fits"]}
    assert 256 <= best < 8192, result
    assert best in fits and any(best < f <= best + 256 for f in fails), result
    # Monotone: nothing that failed is smaller than anything that fitted.
    assert max(fits) < min(fails)
    assert all(t["peak_mb"] <= 800 for t in trials if t["fits"])
    assert all(t["why"] == "over the memory limit" for t in trials if not t["fits"])
    assert f"largest batch that fits: {best}" in proc.stdout
    assert proc.stdout.count("batch ") >= len(trials)  # one progress line per trial


@pytest.mark.parametrize(
    "args,message",
    [
        (["backend=torch", "backend.device=cpu"], "--memory-limit is required on the CPU"),
        (["--memory-limit", "lots", "backend=torch"], "--memory-limit='lots' is not allowed"),
        (["--memory-limit", "1GiB", "trainer.batch_size=8"], "'trainer.batch_size=8' is not allowed"),
    ],
)
def test_what_cannot_be_searched_is_one_line(args, message, tmp_path):
    proc = maxbatch("--out", str(tmp_path / "out"), *args, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip().splitlines()[-1]]
    assert message in proc.stderr
    assert not (tmp_path / "out" / "maxbatch.json").exists()
