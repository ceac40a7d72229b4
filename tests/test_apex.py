"""NVIDIA Apex present, not only absent: the paths a CPU can reach, with Apex 25.04's own code.

Apex is not on PyPI (the package called apex there is unrelated) and its setup.py needs CUDA,
but its Python code imports with a CPU torch from the unpacked source on PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import FAST

TARBALL = Path(__file__).resolve().parents[1].parent / "shared" / "third_party" / "apex-25.04.tar.gz"


@pytest.fixture(scope="module")
def apex_env(tmp_path_factory):
    if not TARBALL.exists():
        pytest.skip(f"NVIDIA Apex's source is not at {TARBALL}")
    folder = tmp_path_factory.mktemp("apex")
    with tarfile.open(TARBALL) as tar:
        tar.extractall(folder, filter="data")
    return {**os.environ, "PYTHONPATH": str(folder / "apex-25.04")}


def python(code: str, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_apex_amp_is_detected(apex_env):
    proc = python(
        "from unitrain.backends.torch.precision import _import_apex_amp; print(_import_apex_amp().__name__)", apex_env
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "apex.amp", proc.stderr[-2000:]


def test_apex_amp_on_a_cpu_stops_at_start_in_one_line(apex_env, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "unitrain",
            "backend=torch",
            "amp=O1",
            "amp.impl=apex",
            *FAST,
            "trainer.steps=2",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        env=apex_env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("unitrain: error:")]
    assert len(errors) == 1 and "Apex's amp needs a CUDA device" in errors[0] and "amp.impl" in errors[0], proc.stderr[
        -2000:
    ]
    assert "Traceback" not in proc.stderr and not (run_dir / "metrics.jsonl").exists()


def test_sync_bn_uses_apex_conversion_when_apex_is_importable(apex_env):
    code = (
        "import unitrain; from unitrain.backends.torch.distributed import _convert_sync_batchnorm\n"
        "m = _convert_sync_batchnorm(unitrain.build_model(unitrain.get_backend('torch'), 'tiny', 10))\n"
        "print(sorted({type(x).__module__ + '.' + type(x).__name__ for x in m.modules()\n"
        "              if 'Norm' in type(x).__name__}))"
    )
    with_apex = python(code, apex_env)
    assert with_apex.returncode == 0, with_apex.stderr[-2000:]
    # Apex prints a warning that it falls back to its Python SyncBatchNorm (no CUDA extension).
    assert with_apex.stdout.strip().splitlines()[-1] == "['apex.parallel.sync_batchnorm.SyncBatchNorm']"
    without = python(code, {k: v for k, v in apex_env.items() if k != "PYTHONPATH"})
    assert without.returncode == 0 and without.stdout.strip() == "['torch.nn.modules.batchnorm.SyncBatchNorm']", (
        without.stderr[-2000:]
    )
