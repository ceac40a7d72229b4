"""Cross-framework parity: shared weights, exact conversion, the parity command."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import paddle
import pytest
import torch

import unitrain
from unitrain.model.weights import convert, from_canonical, to_canonical

P, T = unitrain.get_backend("paddle"), unitrain.get_backend("torch")


@pytest.mark.parametrize("name", ["tiny", "resnet18", "resnet18_cifar", "resnet50"])
def test_round_trip_conversion_is_exact(name):
    torch_state = T.state_arrays(unitrain.build_model(T, name, 10))
    back = convert(convert(torch_state, "torch", "paddle"), "paddle", "torch")
    for key, value in torch_state.items():
        if key.endswith("num_batches_tracked"):
            assert back[key] == 0  # paddle has no such counter
        else:
            assert back[key].dtype == value.dtype and np.array_equal(back[key], value), key
    paddle_state = P.state_arrays(unitrain.build_model(P, name, 10))
    again = convert(convert(paddle_state, "paddle", "torch"), "torch", "paddle")
    assert again.keys() == paddle_state.keys() and all(np.array_equal(again[k], v) for k, v in paddle_state.items())


def test_layouts_and_names_are_mapped():
    canonical = to_canonical("paddle", P.state_arrays(unitrain.build_model(P, "tiny", 7)))
    assert canonical["fc.weight"].shape == (7, 64)  # paddle keeps [in, out]
    assert "bn1.running_mean" in canonical and "bn1.running_var" in canonical
    assert "bn1._mean" in from_canonical("paddle", canonical)


@pytest.mark.parametrize("name, size", [("resnet18", 32), ("resnet18_cifar", 28), ("resnet18_stride2", 28)])
def test_converted_model_computes_the_same_outputs(name, size):
    torch_model = unitrain.build_model(T, name, 10)
    with torch.no_grad():  # non-trivial running statistics, so eval mode tests their mapping
        for m in torch_model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    paddle_model = unitrain.build_model(P, name, 10)
    P.load_state_arrays(paddle_model, convert(T.state_arrays(torch_model), "torch", "paddle"))
    torch_model.eval()
    paddle_model.eval()
    x = np.random.default_rng(0).standard_normal((4, 3, size, size)).astype(np.float32)
    expected = torch_model(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(paddle_model(paddle.to_tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-5)


def test_training_leaves_the_same_batchnorm_statistics_on_both_frameworks():
    """Running statistics feed evaluation, export and inference. Paddle's own BatchNorm folds in
    the biased batch variance and torch's the unbiased one, 1/(n-1) apart: 1/3 here, where
    layer3 and layer4 see n = 4 values a channel (4 images of 1x1 maps). unitrain's models
    follow torch on both, so the same training gives the same model to evaluate."""
    models = {b: unitrain.build_model(b, "tiny", 10, init="shared", seed=3) for b in (P, T)}
    rng = np.random.default_rng(0)
    for batch in (4, 4, 6):  # a smaller last batch too: n is counted per batch
        x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
        models[P](paddle.to_tensor(x)), models[T](torch.from_numpy(x))
    paddle_state, torch_state = (to_canonical(b.name, b.state_arrays(models[b])) for b in (P, T))
    stats = [k for k in torch_state if k.endswith(("running_mean", "running_var"))]
    assert len(stats) == 2 * 12
    for key in stats:
        np.testing.assert_allclose(paddle_state[key], torch_state[key], rtol=1e-5, atol=1e-6, err_msg=key)
    x = rng.standard_normal((3, 3, 16, 16)).astype(np.float32)
    models[P].eval(), models[T].eval()
    expected = models[T](torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(models[P](paddle.to_tensor(x)).numpy(), expected, rtol=1e-4, atol=1e-5)


def test_shared_init_is_identical_on_both_frameworks():
    a = to_canonical("paddle", P.state_arrays(unitrain.build_model(P, "resnet18", 10, init="shared", seed=5)))
    b = T.state_arrays(unitrain.build_model(T, "resnet18", 10, init="shared", seed=5))
    assert all(np.array_equal(a[k], b[k]) for k in b if not k.endswith("tracked"))
    c = T.state_arrays(unitrain.build_model(T, "resnet18", 10, init="shared", seed=6))
    assert not np.array_equal(b["conv1.weight"], c["conv1.weight"])
    assert np.all(b["layer1.0.bn2.weight"] == 0) and np.all(b["layer1.0.bn1.weight"] == 1)  # zero-init residual


def test_weights_for_another_model_are_refused_in_one_line():
    with pytest.raises(unitrain.UnitrainError, match="the weights do not fit this model: .* missing"):
        T.load_state_arrays(
            unitrain.build_model(T, "resnet18", 10), T.state_arrays(unitrain.build_model(T, "tiny", 10))
        )
    with pytest.raises(unitrain.UnitrainError, match="shapes differ"):
        P.load_state_arrays(unitrain.build_model(P, "tiny", 10), P.state_arrays(unitrain.build_model(P, "tiny", 5)))


def run_parity(tmp_path, *args):
    return subprocess.run(
        [sys.executable, "-m", "unitrain.parity", *args, "trainer.threads=1", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )


def test_parity_of_the_tiny_model_within_tolerance(tmp_path):
    proc = run_parity(tmp_path, "model=tiny", "data.image_size=16", "steps=8", "tolerance=1e-5")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "parity.json").read_text())
    assert report["passed"] and len(report["per_step"]) == 8 and report["max_rel_loss_diff"] <= 1e-5
    assert report["first_batch_activations"]["layers_compared"] == 36
    assert report["first_batch_activations"]["first_beyond_tolerance"] is None
    assert all(r["max_param_diff"] < 1e-5 for r in report["per_step"])
    assert report["max_running_stat_rel_diff"] <= 1e-5  # Paddle's own BatchNorm: 3.5e-2 here
    assert report["determinism"]["torch"]["torch.use_deterministic_algorithms"] is True
    # Rounding-level figures move with the kernels the CPU selects: the report says which CPU.
    assert report["cpu"]["extensions"] is not None and "CPU: " in proc.stdout
    assert (tmp_path / "parity.png").read_bytes().startswith(b"\x89PNG")
    assert "| step | loss paddle | loss torch |" in proc.stdout and "within tolerance" in proc.stdout


def test_parity_beyond_tolerance_exits_non_zero_and_names_the_layer(tmp_path):
    # A tolerance no fp32 computation meets: the command must fail, and point at a layer.
    proc = run_parity(
        tmp_path, "model=tiny", "data.image_size=16", "steps=3", "tolerance=1e-15", "activation_tolerance=1e-15"
    )
    assert proc.returncode == 1
    report = json.loads((tmp_path / "parity.json").read_text())
    assert not report["passed"] and report["first_batch_activations"]["first_beyond_tolerance"]["layer"]
    assert "BEYOND tolerance" in proc.stdout


def test_recipe_optimizer_features_follow_one_update_rule_on_both(tmp_path):
    """Nesterov, label smoothing, global-norm clipping and no decay on BatchNorm and biases:
    each framework's own implementation, one result. (Paddle clips parameter groups separately,
    so unitrain gives it no groups; a norm of 0.5 binds from the first step, where it is about 4.4.)"""
    proc = run_parity(
        tmp_path,
        "model=tiny",
        "data.image_size=16",
        "steps=6",
        "tolerance=1e-5",
        "optim.nesterov=true",
        "optim.label_smoothing=0.1",
        "optim.clip_grad_norm=0.5",
        "optim.decay_norm_and_bias=false",
        "optim.weight_decay=0.05",
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads((tmp_path / "parity.json").read_text())["max_rel_loss_diff"] <= 1e-5
