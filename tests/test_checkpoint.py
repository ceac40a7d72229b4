"""Checkpoints: atomic, exact on resume, convertible, and refused clearly when they do not fit."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import BACKENDS, FAST, run_unitrain

CKPT = [*FAST, "trainer.steps=8", "trainer.checkpoint_every=4", "trainer.save_final_weights=true"]


def losses(result):
    return [(r["step"], r["loss"]) for r in result.metrics()]


def final_weights(result):
    with np.load(result.run_dir / "final_weights.rank0.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module", params=BACKENDS)
def finished(request, tmp_path_factory):
    """An uninterrupted 8-step run that checkpointed at steps 4 and 8."""
    backend = request.param
    result = run_unitrain([f"backend={backend}", *CKPT], tmp_path_factory.mktemp(f"full-{backend}"))
    assert result.returncode == 0, result.stderr[-2000:]
    return backend, result


def test_checkpoints_are_complete_and_latest_points_to_the_newest(finished):
    _, full = finished
    root = full.run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step4", "step8"]  # no temporary leftovers
    assert (root / "latest").read_text() == "step8"
    for step in ("step4", "step8"):
        assert {p.name for p in (root / step).iterdir()} == {"meta.json", "model.npz", "training_state"}


def test_resumed_run_equals_the_uninterrupted_one(finished, tmp_path):
    backend, full = finished
    resumed = run_unitrain([f"backend={backend}", *CKPT, f"trainer.resume={full.run_dir / 'checkpoints' / 'step4'}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # fp32, one process, deterministic kernels: bit for bit.
    assert losses(resumed) == losses(full)[4:]
    a, b = final_weights(resumed), final_weights(full)
    assert all(np.array_equal(a[k], b[k]) for k in b)


def test_resume_latest_continues_the_newest_run(finished, tmp_path):
    backend, full = finished
    # "latest" searches ./runs and ./multirun below the working directory.
    shutil.copytree(full.run_dir, tmp_path / "runs" / "old")
    longer = run_unitrain([f"backend={backend}", *FAST, "trainer.steps=10", "trainer.resume=latest"], tmp_path)
    assert longer.returncode == 0, longer.stderr[-2000:]
    assert [s for s, _ in losses(longer)] == [9, 10]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_data_parallel_resume_equals_the_uninterrupted_run(backend, tmp_path):
    dp = [f"backend={backend}", *CKPT, "dist.nproc_per_node=2", "trainer.threads=1"]
    full = run_unitrain(dp, tmp_path / "full")
    assert full.returncode == 0, full.stderr[-2000:]
    resumed = run_unitrain([*dp, f"trainer.resume={full.run_dir / 'checkpoints' / 'step4'}"], tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert losses(resumed) == losses(full)[4:]


def test_truncated_checkpoint_is_refused_and_nothing_changes(finished, tmp_path):
    backend, full = finished
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("meta.json", "training_state"):
        (broken / name).write_bytes((full.run_dir / "checkpoints" / "step4" / name).read_bytes())
    original = (full.run_dir / "checkpoints" / "step4" / "model.npz").read_bytes()
    (broken / "model.npz").write_bytes(original[: len(original) // 2])
    before = sorted(p.name for p in broken.iterdir())
    result = run_unitrain([f"backend={backend}", *CKPT, f"trainer.resume={broken}"], tmp_path / "new")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"unitrain: error: checkpoint {broken} is corrupt or truncated: model.npz")
    assert sorted(p.name for p in broken.iterdir()) == before
    assert not (result.run_dir / "metrics.jsonl").exists() and not (result.run_dir / "checkpoints").exists()


def test_checkpoint_of_another_framework_or_model_is_refused(finished, tmp_path):
    backend, full = finished
    other = "torch" if backend == "paddle" else "paddle"
    step4 = full.run_dir / "checkpoints" / "step4"
    wrong_framework = run_unitrain([f"backend={other}", *CKPT, f"trainer.resume={step4}"], tmp_path / "fw")
    assert wrong_framework.returncode == 2
    assert f"was written by {backend}, and backend={other} cannot resume it; python -m unitrain.convert" in wrong_framework.stderr
    wrong_model = run_unitrain([f"backend={backend}", *CKPT, "model=resnet18", f"trainer.resume={step4}"], tmp_path / "model")
    assert wrong_model.returncode == 2 and "holds model=tiny, not model=resnet18" in wrong_model.stderr


def test_converted_checkpoint_loads_in_plain_framework_code(finished, tmp_path):
    backend, full = finished
    other = "torch" if backend == "paddle" else "paddle"
    out = tmp_path / f"weights.{other}"
    proc = subprocess.run([sys.executable, "-m", "unitrain.convert", str(full.run_dir), "--to", other, "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"step 8) -> {other}" in proc.stdout
    # Plain framework code, no unitrain: the file loads as a dict of named tensors.
    plain = {
        "torch": "import torch; sd = torch.load(r'{p}'); print(len(sd), tuple(sd['fc.weight'].shape), sd['bn1.running_var'].dtype)",
        "paddle": "import paddle; sd = paddle.load(r'{p}'); print(len(sd), tuple(sd['fc.weight'].shape), sd['bn1._variance'].dtype)",
    }[other].format(p=out)
    loaded = subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert ("62 (64, 10)" if other == "paddle" else "74 (10, 64)") in loaded.stdout

    # And the converted weights compute what the original ones do.
    import paddle
    import torch

    import unitrain
    from unitrain.checkpoint import read_model_arrays

    source = unitrain.get_backend(backend)
    target = unitrain.get_backend(other)
    original = source.build_model("tiny", 10)
    source.load_state_arrays(original, read_model_arrays(full.run_dir / "checkpoints" / "step8"))
    converted = target.build_model("tiny", 10)
    if other == "torch":
        converted.load_state_dict(torch.load(out))
    else:
        converted.set_state_dict(paddle.load(str(out)))
    original.eval()
    converted.eval()
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    run = lambda b, m: b.to_numpy(m(paddle.to_tensor(x) if b.name == "paddle" else torch.from_numpy(x)))  # noqa: E731
    np.testing.assert_allclose(run(target, converted), run(source, original), rtol=1e-4, atol=1e-5)
