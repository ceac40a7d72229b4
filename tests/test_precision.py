"""Mixed precision O0-O3 with one meaning on both backends, and honesty about what ran."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import unitrain
from conftest import BACKENDS, FAST
from unitrain import AmpConfig
from unitrain.model.build import build_model

torch_backend = unitrain.get_backend("torch")


def dtypes_of(model: nn.Module, x: torch.Tensor, precision) -> dict:
    seen = {}
    hooks = [
        m.register_forward_hook(lambda m, i, o, n=n: seen.__setitem__(n, o.dtype)) for n, m in model.named_children()
    ]
    with precision.autocast():
        out = model(precision.convert_input(x))
        loss = torch_backend.loss(out, torch.zeros(x.shape[0], dtype=torch.long))
    for h in hooks:
        h.remove()
    return {**seen, "loss": loss.dtype}


def small_net() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5), nn.Softmax(dim=1)
    )


def decorated(cfg: AmpConfig, net: nn.Module | None = None, lr: float = 0.1):
    net = net or small_net()
    precision = torch_backend.precision(cfg)
    model, optimizer = precision.decorate(net, torch.optim.SGD(net.parameters(), lr=lr))
    return precision, model, optimizer


def test_torch_o1_bfloat16_follows_the_op_lists():
    x = torch.randn(2, 3, 8, 8)
    precision, model, _ = decorated(AmpConfig(level="O1", dtype="bfloat16"))
    d = dtypes_of(model, x, precision)
    assert d["0"] == torch.bfloat16 and d["4"] == torch.bfloat16  # conv, linear: white list
    assert d["5"] == torch.float32  # softmax: default black list (torch's CPU autocast alone gives bf16)
    assert d["loss"] == torch.float32
    assert precision.effective == "O1 bfloat16"

    precision, model, _ = decorated(AmpConfig(level="O1", dtype="bfloat16", custom_black_list=["conv2d"]))
    assert dtypes_of(model, x, precision)["0"] == torch.float32

    precision, model, _ = decorated(AmpConfig(level="O1", dtype="bfloat16", custom_white_list=["softmax"]))
    assert dtypes_of(model, x, precision)["5"] == torch.bfloat16


def test_unknown_op_name_lists_the_allowed_ones():
    with pytest.raises(unitrain.ConfigError, match="amp.custom_black_list=.*op names from conv2d, linear"):
        torch_backend.precision(AmpConfig(level="O1", custom_black_list=["gemm"]))


def test_torch_o2_keeps_norm_layers_fp32_and_steps_fp32_master_weights():
    precision, model, optimizer = decorated(AmpConfig(level="O2", dtype="bfloat16"))
    assert model[0].weight.dtype == torch.bfloat16 and model[4].weight.dtype == torch.bfloat16
    assert model[1].weight.dtype == torch.float32  # BatchNorm
    stepped = [p for g in optimizer.param_groups for p in g["params"]]
    assert all(p.dtype == torch.float32 for p in stepped)


@pytest.mark.parametrize("level,master_moves", [("O2", True), ("O3", False)])
def test_tiny_updates_accumulate_in_the_master_copy_only_with_o2(level, master_moves):
    net = nn.Linear(1, 1, bias=False)
    nn.init.ones_(net.weight)
    precision = torch_backend.precision(AmpConfig(level=level, dtype="bfloat16"))
    model, optimizer = precision.decorate(net, torch.optim.SGD(net.parameters(), lr=1e-4))
    for _ in range(10):
        with precision.autocast():
            loss = model(precision.convert_input(torch.ones(1, 1))).float().sum()  # d loss / d w = 1
        precision.backward(loss)
        precision.step(optimizer)
        optimizer.zero_grad()
    # 10 updates of 1e-4 are each below half a bfloat16 step at 1.0 (2**-9): the bf16 weight
    # cannot move by itself; only an fp32 master copy keeps them.
    assert model.weight.dtype == torch.bfloat16 and model.weight.item() == 1.0
    stepped = optimizer.param_groups[0]["params"][0]
    if master_moves:
        assert stepped.dtype == torch.float32 and stepped.item() == pytest.approx(1 - 1e-3, abs=1e-6)
    else:
        assert stepped is model.weight


def _scaler_run(precision, model, optimizer, pattern):
    scales, kept = [], []
    for bad in pattern:
        before = [p.detach().clone() for p in model.parameters()]
        with precision.autocast():
            loss = model(torch.ones(2, 3, 8, 8)).float().mean() * (math.inf if bad else 1.0)
        precision.backward(loss)
        stepped = precision.step(optimizer)
        optimizer.zero_grad()
        kept.append(all(torch.equal(b, p) for b, p in zip(before, model.parameters())))
        assert stepped == (not bad)
        scales.append(precision.metrics()["loss_scale"])
    return scales, kept


def test_loss_scaler_skips_inf_steps_and_matches_torch_grad_scaler():
    knobs = dict(init_loss_scaling=1024.0, incr_ratio=2.0, decr_ratio=0.5, incr_every_n_steps=2)
    # A fixed draw and a gentle lr: at lr 0.1 the weights of this small net can grow until a
    # clean step overflows float16 for real (and is rightly skipped), which is not under test.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 2, 3), nn.Flatten(), nn.Linear(72, 3))
    reference_net = copy.deepcopy(net)
    precision, model, optimizer = decorated(AmpConfig(level="O1", dtype="float16", **knobs), net, lr=1e-3)
    pattern = [False, True, False, False, True, False, False, False]
    scales, kept = _scaler_run(precision, model, optimizer, pattern)
    assert scales[:2] == [1024.0, 512.0]  # the inf step halves the scale
    assert kept == pattern  # ...and leaves the parameters as they were
    assert scales[3] == 1024.0  # two clean steps later it grows again
    assert precision.metrics()["skipped_steps"] == 2

    # The same knobs on a bare torch.amp.GradScaler give the same sequence.
    reference = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)
    ref_opt = torch.optim.SGD(reference_net.parameters(), lr=1e-3)
    ref_scales = []
    for bad in pattern:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = reference_net(torch.ones(2, 3, 8, 8)).float().mean() * (math.inf if bad else 1.0)
        reference.scale(loss).backward()
        reference.step(ref_opt)
        reference.update()
        ref_opt.zero_grad()
        ref_scales.append(reference.get_scale())
    assert scales == ref_scales

    restored = torch_backend.precision(AmpConfig(level="O1", dtype="float16", **knobs))
    restored.decorate(small_net(), torch.optim.SGD(small_net().parameters(), lr=0.1))
    restored.load_state_dict(precision.state_dict())
    assert restored.metrics() == precision.metrics()
    assert restored.state_dict() == precision.state_dict()


def test_loss_scaling_is_on_for_float16_and_off_for_bfloat16():
    assert decorated(AmpConfig(level="O1", dtype="float16"))[0].metrics()["loss_scale"] == 65536.0
    assert decorated(AmpConfig(level="O1", dtype="bfloat16"))[0].metrics()["loss_scale"] == 1.0
    assert (
        decorated(AmpConfig(level="O1", dtype="bfloat16", use_dynamic_loss_scaling=True))[0].metrics()["loss_scale"]
        == 65536.0
    )


def test_decr_every_n_has_no_torch_counterpart():
    with pytest.raises(unitrain.ConfigError, match="amp.decr_every_n_nan_or_inf=2 is not allowed: 1 on backend=torch"):
        decorated(AmpConfig(level="O1", dtype="float16", decr_every_n_nan_or_inf=2))


def test_paddle_amp_on_cpu_decorates_but_reports_fp32():
    import paddle

    paddle_backend = unitrain.get_backend("paddle")
    model = build_model(paddle_backend, "tiny", num_classes=3)
    optimizer = paddle_backend.build_optimizer(model)
    precision = paddle_backend.precision(AmpConfig(level="O2", dtype="float16"))
    decorated_model, decorated_optimizer = precision.decorate(model, optimizer)
    # paddle 3.3.1's amp.decorate returns at once on a CPU place (paddle/amp/auto_cast.py checks
    # for GPU/XPU/custom places first): parameters stay fp32, and the run must say so.
    assert decorated_model is model and decorated_optimizer is optimizer
    assert all(p.dtype == paddle.float32 for p in model.parameters())
    assert precision.requested == "O2 float16" and precision.effective == "fp32"
    assert "CUDAPlace" in precision.fallback_reason
    assert precision.describe()["effective"] == "fp32" and precision.metrics() == {
        "loss_scale": 1.0,
        "skipped_steps": 0,
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_every_level_trains(backend, level, unitrain_cli):
    result = unitrain_cli(
        # 32x32: at 16x16 the tiny ResNet's layer4 sees one pixel, where torch's oneDNN bf16 conv
        # backward gives NaN gradients at random on AVX-512 CPUs (the run warns of it).
        f"backend={backend}",
        f"amp={level}",
        "amp.dtype=bfloat16",
        *FAST,
        "data.image_size=32",
        "trainer.steps=25",
        "optim.lr=0.05",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = result.metrics()
    assert all(math.isfinite(r["loss"]) for r in records)
    if level in ("O0", "O1", "O2"):
        assert sum(r["loss"] for r in records[-5:]) / 5 < 0.7 * sum(r["loss"] for r in records[:3]) / 3
    p = result.summary()["precision"]
    expected = "fp32" if level == "O0" or backend == "paddle" else f"{level} bfloat16"
    assert p["effective"] == expected
    if backend == "paddle" and level != "O0":
        assert p["requested"] == f"{level} bfloat16" and "cannot take effect on cpu" in result.stdout + result.stderr
        assert f"| paddle | tiny | {level} bfloat16 | fp32 |" in result.stdout  # requested, then what ran
    if level != "O0":
        assert "loss_scale" in records[0] and records[-1]["skipped_steps"] == 0


def test_apex_without_apex_fails_at_start(unitrain_cli):
    result = unitrain_cli("backend=torch", "amp=O1", "amp.impl=apex", *FAST, "trainer.steps=2")
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert (
        line.startswith("unitrain: error: amp.impl='apex' is not allowed: native here: NVIDIA Apex is not installed")
        and "25.04" in line
        and "amp.impl=native" in line
    )
    assert not result.run_dir.exists()  # refused before anything is written


@pytest.mark.parametrize(
    "lists,expected",
    [
        # torch's own CPU autocast keeps LayerNorm in fp32; unitrain's default black list softmax;
        # GELU follows its input.
        ({}, {"qkv": "bfloat16", "softmax": "float32", "norm1": "float32", "act": "bfloat16", "head": "bfloat16"}),
        ({"custom_black_list": ["gelu"]}, {"act": "float32", "fc2": "bfloat16"}),
        ({"custom_white_list": ["softmax", "layer_norm"]}, {"softmax": "bfloat16", "norm1": "bfloat16"}),
    ],
)
def test_o1_lists_around_a_transformers_softmax_layernorm_and_gelu(lists, expected):
    from unitrain.model.custom import sized

    backend = torch_backend
    model = build_model(backend, sized("vit_tiny", 16), 10, init="shared")
    precision = backend.precision(AmpConfig(level="O1", dtype="bfloat16", **lists))
    model, _ = precision.decorate(model, backend.build_optimizer(model))
    seen = {}
    for name, module in model.named_modules():
        if not list(module.children()):
            short = name.split(".")[-1]
            # A hook that returns something replaces the output: update() returns None.
            module.register_forward_hook(lambda m, i, out, short=short: seen.update({short: str(out.dtype)[6:]}))
    with precision.autocast():
        model(torch.zeros(2, 3, 16, 16))
    assert {k: seen[k] for k in expected} == expected
