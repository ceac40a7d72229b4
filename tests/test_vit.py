"""The built-in Vision Transformers: one spec, the same parameter names on both frameworks, so
shared initial weights, parity, conversion and export hold as for the ResNets."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import BACKENDS, run_unitrain
from unitrain.interface.backend import get_backend
from unitrain.model.custom import sized
from unitrain.model.weights import convert

VIT = ["model=vit_tiny", "data.image_size=16", "trainer.threads=2", "trainer.progress=false"]


def test_both_frameworks_build_the_same_vit_and_compute_the_same_logits():
    import paddle
    import torch

    spec = sized("vit_tiny", 16)
    t, p = get_backend("torch"), get_backend("paddle")
    mt, mp = t.build_model(spec, 10, init="shared", seed=3), p.build_model(spec, 10, init="shared", seed=3)
    torch_state, paddle_state = t.state_arrays(mt), convert(p.state_arrays(mp), "paddle", "torch")
    assert list(torch_state) == list(paddle_state)  # the same names, in the same order
    assert all(np.array_equal(torch_state[k], paddle_state[k]) for k in torch_state)
    x = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)
    mt.eval(), mp.eval()
    got, want = mp(paddle.to_tensor(x)).numpy(), mt(torch.from_numpy(x)).detach().numpy()
    assert np.abs(got - want).max() < 1e-5 * max(1.0, np.abs(want).max())


def test_vit_parity_within_tolerance(tmp_path):
    result = run_unitrain(["model=vit_tiny", "data.image_size=16", "steps=4"], tmp_path, module="unitrain.parity")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((result.run_dir / "parity.json").read_text())
    assert report["passed"] and report["max_rel_loss_diff"] < 1e-5
    assert report["first_batch_activations"]["first_beyond_tolerance"] is None
    assert report["first_batch_activations"]["layers_compared"] >= 15


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    runs = {}
    for backend in BACKENDS:
        root = tmp_path_factory.mktemp(f"vit_{backend}")
        args = [f"backend={backend}", *VIT, "trainer.steps=6", "trainer.checkpoint_every=6", "model.init=shared"]
        runs[backend] = run_unitrain(args, root)
        assert runs[backend].returncode == 0, runs[backend].stderr[-3000:]
    return runs


def test_vit_trains_on_both_from_the_same_weights(trained):
    first = {b: trained[b].metrics()[0]["loss"] for b in BACKENDS}
    assert abs(first["paddle"] - first["torch"]) < 1e-5 * abs(first["torch"]), first
    assert all(np.isfinite(r["loss"]) for b in BACKENDS for r in trained[b].metrics())


def test_a_paddle_vit_exports_to_torch_and_onnx_checked(trained):
    run = trained["paddle"].run_dir
    done = subprocess.run(
        [sys.executable, "-m", "unitrain.export", str(run), "--format", "native,onnx", "--to", "torch,paddle"],
        cwd=run.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((run / "export" / "export.json").read_text())
    diffs = {name: a["max_abs_diff"] for name, a in manifest["artifacts"].items()}
    assert len(diffs) == 4 and max(diffs.values()) < 1e-4, diffs


def test_an_image_size_the_patches_do_not_divide_is_refused(tmp_path):
    result = run_unitrain(["model=vit_tiny", "data.image_size=30", "trainer.steps=2"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "unitrain: error: data.image_size=30 is not allowed: a multiple of vit_tiny's patch size 4"
    ), result.stderr[-2000:]


def test_a_vit_quantizes_in_paddle_and_onnx_runtime(trained):
    # Attention's activation-by-activation matmuls and GELU go through Paddle's legacy program
    # and ONNX Runtime's pre-processing, which the ResNets never asked of them.
    run = trained["torch"].run_dir
    done = subprocess.run(
        [sys.executable, "-m", "unitrain.quantize", str(run), "method=static", "backend=paddle", "pairs=2"]
        + ["min_time_s=0.1", "min_iters=2", "eval_samples=32", "batches=[8]", f"hydra.run.dir={run.parent / 'q'}"],
        cwd=run.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((run.parent / "q" / "quantize.json").read_text())
    int8 = {r["runtime"]: r for r in result["rows"] if r["precision"] == "static"}
    assert "onnxruntime" in int8 and any("int8" in r["runtime"] for r in int8.values()), list(int8)
    assert all(r["effective"].startswith("int8") or "simulated" in r["effective"] for r in int8.values())
