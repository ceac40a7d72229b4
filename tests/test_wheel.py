"""A wheel built from the repo installs into a fresh venv and runs from outside the source tree."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def sh(*cmd, cwd, timeout=900):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return proc


@pytest.mark.slow
def test_wheel_in_fresh_venv_runs_outside_source_tree(tmp_path):
    # From a clean copy: setuptools reuses a build/ folder, which could carry stale modules.
    source = tmp_path / "source"
    # Not the environments either: .venv-ps alone is about 2 GB.
    top_level_outputs = {"build", "dist", "runs", "multirun", ".git"}  # conf/dist is a config group
    shutil.copytree(
        REPO,
        source,
        ignore=lambda d, names: [
            n
            for n in names
            if (Path(d) == REPO and (n in top_level_outputs or n.startswith(".venv")))
            or n == "__pycache__"
            or n.endswith(".egg-info")
        ],
    )
    # -v shows setuptools' own output: what it deprecates today stops building later (the
    # license table form on 2027-02-18), and a folder it "would ignore" would drop configs.
    built = sh(sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", tmp_path / "dist", source, cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    build_output = built.stdout + built.stderr
    for warning in ("is deprecated", "would be ignored", "is absent from the `packages` configuration"):
        assert warning not in build_output, build_output[build_output.find(warning) - 1500 :][:3000]
    (wheel,) = (tmp_path / "dist").glob("unitrain-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"unitrain/conf/{p.relative_to(REPO / 'conf')}" for p in (REPO / "conf").rglob("*.yaml")}
    assert configs and not configs - shipped, sorted(configs - shipped)

    venv = tmp_path / "venv"
    assert sh(sys.executable, "-m", "venv", venv, cwd=tmp_path).returncode == 0
    python = venv / "bin" / "python"
    # Only the torch extra: the paddle backend must then say which extra is missing.
    # --no-compile: compiling torch's thousands of modules ahead is most of the install's CPU time,
    # and Python compiles what it imports anyway.
    installed = sh(python, "-m", "pip", "install", "--quiet", "--no-compile", f"{wheel}[torch]", cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-2000:]

    work = tmp_path / "elsewhere"
    work.mkdir()
    where = sh(
        python, "-c", "import unitrain, unitrain.backends.torch as b; print(unitrain.__file__, b.__file__)", cwd=work
    )
    assert str(venv) in where.stdout and str(REPO) not in where.stdout, where.stdout + where.stderr

    run = sh(
        python,
        "-m",
        "unitrain",
        "backend=torch",
        "model=tiny",
        "data.image_size=16",
        "trainer.steps=3",
        "trainer.threads=1",
        "trainer.progress=false",
        "hydra.run.dir=out",
        cwd=work,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((work / "out" / "summary.json").read_text())
    assert summary["backend"] == "torch" and summary["steps"] == 3
    assert "| torch | tiny | O0 float32 | fp32 | 1 |" in run.stdout

    # hydra/sweeper=optuna is in the wheel: Hydra's own scan of hydra_plugins finds it (an editable
    # install's finder hides it from that scan), importing no Optuna, which only a search needs.
    scan = "from hydra.core.plugins import Plugins; from hydra.plugins.sweeper import Sweeper; import sys; "
    scan += "print([c.__module__ for c in Plugins.instance().discover(Sweeper)], 'optuna' in sys.modules)"
    found = sh(python, "-c", scan, cwd=work)
    assert "'hydra_plugins.unitrain_sweeper'" in found.stdout and found.stdout.strip().endswith("] False"), (
        found.stdout + found.stderr
    )
    search = sh(python, "-m", "unitrain", "-m", "hydra/sweeper=optuna", "optim.lr=interval(0.01,0.1)", cwd=work)
    assert search.returncode == 2 and search.stderr.strip() == (
        "unitrain: error: hydra/sweeper=optuna needs Optuna, which is not installed; install it with: "
        "pip install 'unitrain[sweeps]'"
    )
    assert not (work / "multirun").exists()

    missing = sh(python, "-m", "unitrain", "backend=paddle", "model=tiny", "hydra.run.dir=out2", cwd=work)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1] == (
        "unitrain: error: backend 'paddle' needs the 'paddle' framework, which is not installed; "
        "install it with: pip install 'unitrain[paddle]'"
    )
