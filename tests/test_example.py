"""The library guide's custom loop runs unchanged on both frameworks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_loop.py"


@pytest.mark.parametrize("backend", ["paddle", "torch"])
def test_custom_loop_trains(backend, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), backend], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    losses = [float(line.split()[-1]) for line in proc.stdout.splitlines() if line.startswith(f"{backend} epoch")]
    assert len(losses) == 3 and losses[-1] < losses[0]


def test_the_library_guide_shows_the_example():
    guide = (EXAMPLE.parents[1] / "docs" / "library.md").read_text()
    body = EXAMPLE.read_text()
    start = body.index("import unitrain")
    assert body[start:].strip() in guide
