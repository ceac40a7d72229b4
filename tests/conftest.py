from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Set

import pytest

# Small and quick: a tiny ResNet on small images, two threads (this machine's cores).
FAST = ["model=tiny", "data.image_size=16", "trainer.threads=2", "trainer.progress=false"]
BACKENDS = ["paddle", "torch"]


class CliResult:
    def __init__(self, proc: subprocess.CompletedProcess, run_dir: Path):
        self.returncode, self.stdout, self.stderr, self.run_dir = proc.returncode, proc.stdout, proc.stderr, run_dir

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def metrics(self) -> List[dict]:
        """The training steps (held-out evaluations are lines of their own, without "loss")."""
        return [r for r in map(json.loads, (self.run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def run_unitrain(
    args: List[str], tmp_path: Path, module: str = "unitrain", timeout: int = 300, python: str | None = None
) -> CliResult:
    """Run ``python -m unitrain`` as a user would, from outside the source tree, into tmp_path
    (``python``: another environment's interpreter, e.g. the parameter-server one)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    run_dir = tmp_path / "run"
    hydra_dirs = [f"hydra.run.dir={run_dir}", f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [python or sys.executable, "-m", module, *args, *hydra_dirs],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return CliResult(proc, run_dir)


@pytest.fixture
def unitrain_cli(tmp_path):
    return lambda *args, **kw: run_unitrain(list(args), tmp_path, **kw)


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
