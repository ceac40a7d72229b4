"""Bad input: one line naming the key and what is allowed, a non-zero exit, no traceback, nothing lost."""

from __future__ import annotations

import pytest

from conftest import FAST


@pytest.mark.parametrize(
    "args,expected",
    [
        (["backend=tensorflow"], "backend='tensorflow' is not allowed: one of paddle, torch"),
        (["-m", "backend=paddle,jax"], "backend='jax' is not allowed: one of paddle, torch"),
        (["model=vgg"], "model='vgg' is not allowed: one of resnet18, resnet50, tiny"),
        (["data=imagefolder"], "data.path=None is not allowed"),
        (["data=imagefolder", "data.path=/no/such/dir"], "data.path='/no/such/dir' is not allowed: an existing directory"),
        (["optim.lr=0"], "optim.lr=0.0 is not allowed: a number > 0"),
        (["optim.lr=-0.1"], "optim.lr=-0.1 is not allowed: a number > 0"),
        (["trainer.batch_size=64", "data.num_samples=20"], "trainer.batch_size=64 is not allowed: at most 20"),
        (["backend=paddle", "amp.impl=apex"], "amp.impl='apex' is not allowed: native with backend=paddle"),
        (["amp=O1", "amp.custom_white_list=[gemm]"], "amp.custom_white_list=['gemm'] is not allowed: op names from conv2d"),
        (["dist.node_rank=1"], "dist.node_rank=1 is not allowed: an integer in [0, 1) (dist.nnodes=1)"),
        (["dist.nnodes=2"], "dist.master_port=None is not allowed: a port number that every node uses"),
        (["dist.nproc_per_node=0"], "dist.nproc_per_node=0 is not allowed: a number > 0"),
    ],
)
def test_bad_input_gives_one_line(args, expected, unitrain_cli):
    result = unitrain_cli(*args, *FAST, "trainer.steps=2")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("unitrain: error:")]
    assert len(errors) == 1 and expected in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (result.run_dir / "summary.json").exists()


def test_empty_imagefolder(unitrain_cli, tmp_path):
    (tmp_path / "data" / "cls").mkdir(parents=True)
    result = unitrain_cli("data=imagefolder", f"data.path={tmp_path / 'data'}", *FAST)
    assert result.returncode == 2 and "none found" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["trainer.stepz=3"], ["trainer.steps=many"]])
def test_wrong_key_or_type_fails_at_start_with_hydra_error(args, unitrain_cli):
    result = unitrain_cli(*args, *FAST)
    assert result.returncode != 0
    assert "trainer.step" in result.stderr and "Traceback" not in result.stderr
    assert not (result.run_dir / "metrics.jsonl").exists()


def test_missing_framework_names_the_extra(tmp_path):
    import subprocess
    import sys

    # A fresh interpreter in which paddle cannot be imported, as on a machine without it.
    code = (
        "import sys; sys.modules['paddle'] = None\n"
        "import unitrain\n"
        "try:\n    unitrain.get_backend('paddle')\n"
        "except unitrain.BackendUnavailableError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path).stdout
    assert "backend 'paddle' needs the 'paddle' framework, which is not installed" in out
    assert "pip install 'unitrain[paddle]'" in out
