"""What a killed job's launcher left on the machine goes at the next unitrain start, whatever that
start runs (here a one-process torch job), with one line; a running job's folder stays."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import FAST
from unitrain.host.processes import start_time


@pytest.mark.slow  # a job's start (about 5 s alone; over 15 s on a loaded machine)
def test_any_start_removes_a_killed_paddle_jobs_launch_folder_and_keeps_a_running_ones(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that ran once and runs no more
    stale = tmpdir / f"unitrain-paddle-launch-{gone.pid}-{12345}-abcd1234"
    live = tmpdir / f"unitrain-paddle-launch-{os.getpid()}-{start_time(os.getpid())}-efgh5678"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "envlog.0").write_text("what an older launcher wrote\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "unitrain",
            "backend=torch",
            *FAST,
            "trainer.steps=1",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmpdir)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not stale.exists() and live.exists()
    said = [line for line in (done.stdout + done.stderr).splitlines() if "no longer run" in line]
    assert len(said) == 1 and stale.name in said[0], said
