"""Write it once, round two: models written the way torchvision and timm write theirs
(examples/gallery: EfficientNet, MobileNetV3, ConvNeXt, Swin, ResNeXt, DenseNet) convert
unmodified, train alike from shared weights with their random layers off, and parity names a
random layer when they are on. The Swin (buffers, torch.roll, every form of view) is exported and
quantized by Paddle; the EfficientNet goes through test_write_once's export test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import test_write_once
from test_write_once import QUICK_QUANTIZE, run_unitrain_module

# test_write_once's user folder (the gallery and models that do not convert), shared by name.
project, in_project = test_write_once.project, test_write_once.in_project

#: Each family and the keywords that turn its random layers off.
IDIOMS = {
    "efficientnet": {"drop_path": 0.0, "dropout": 0.0},
    "mobilenetv3": {"dropout": 0.0},
    "convnext": {"drop_path": 0.0},
    "swin": {"drop_path": 0.0},
    "resnext": {},
    "densenet": {"drop_rate": 0.0},
}


def _parity(name: str, kwargs: dict, steps: int):
    from hydra import compose, initialize_config_module

    from unitrain.config.schema import register_configs
    from unitrain.train.parity import check_converted, run_parity

    register_configs()
    overrides = ["model=custom", f"model.torch=gallery.{name}:build", "model.paddle=convert", "data.image_size=16"]
    overrides += [f"steps={steps}", "optim.lr=0.001", "trainer.batch_size=16", "trainer.threads=1"]
    overrides += [f"+model.kwargs.{k}={v}" for k, v in kwargs.items()]
    with initialize_config_module("unitrain.conf", version_base=None):
        cfg = compose("parity", overrides=overrides)
    out = Path.cwd() / f"parity-{name}-{len(kwargs)}"
    out.mkdir(exist_ok=True)
    return check_converted(cfg, "paddle"), run_parity(cfg, out)


@pytest.mark.slow
@pytest.mark.parametrize("name", IDIOMS)
@pytest.mark.usefixtures("in_project")
def test_a_library_style_model_converts_unmodified_and_trains_alike(name):
    forward, report = _parity(name, IDIOMS[name], steps=4)
    assert forward["layers_unpaired"] == 0 and forward["largest"]["rel_diff"] <= 1e-4
    assert report["max_rel_loss_diff"] <= 1e-4 and report["passed"], report["per_step"]
    assert report["random_layer"] is None


@pytest.mark.slow
@pytest.mark.usefixtures("in_project")
def test_parity_names_the_random_layer_that_keeps_the_steps_apart():
    _, report = _parity("efficientnet", {}, steps=2)  # stochastic depth and dropout on
    assert not report["passed"] and report["random_layer"] == "features.3.stochastic_depth"


@pytest.mark.slow
def test_the_swin_exports_and_quantizes_in_paddle(request, tmp_path):
    root = tmp_path / "user"
    shutil.copytree(request.getfixturevalue("project"), root, ignore=shutil.ignore_patterns("parity-*"))
    job = ["backend=paddle", "model=custom", "model.torch=gallery.swin:build", "model.paddle=convert"]
    run = root / "run"
    trained = run_unitrain_module(
        root,
        "unitrain",
        *job,
        "data.image_size=16",
        "trainer.batch_size=8",
        "trainer.steps=2",
        "trainer.checkpoint_every=2",
        f"hydra.run.dir={run}",
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    export = run_unitrain_module(root, "unitrain.export", str(run), "--format=native,onnx", f"--out={tmp_path / 'x'}")
    assert export.returncode == 0, export.stderr[-2000:]
    assert len(json.loads((tmp_path / "x" / "export.json").read_text())["artifacts"]) == 2
    out = tmp_path / "q"
    done = run_unitrain_module(
        root, "unitrain.quantize", str(run), "method=dynamic", "backend=paddle", *QUICK_QUANTIZE, f"hydra.run.dir={out}"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    int8 = [r for r in json.loads((out / "quantize.json").read_text())["rows"] if r["precision"] == "dynamic"]
    assert int8 and not any(r["effective"].startswith("FAILED") for r in int8), int8
