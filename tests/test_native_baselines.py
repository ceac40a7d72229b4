"""The benchmark's hand-written baselines train the same network as unitrain, built without it.

Their models are their own (torch: a torchvision ResNet and a timm-style ViT written out in the
script; Paddle: paddle.vision.models and a PaddleClas-style ViT) so that the overhead benchmark
can see a cost living in unitrain's models; this checks once that they are still the same
network: parameter names, shapes, FLOPs.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from unitrain.spec.models import MODELS

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SIZES = [("resnet18", 32), ("resnet50", 64), ("vit_tiny", 32), ("vit_small", 32)]


def load(framework: str):
    spec = importlib.util.spec_from_file_location(f"native_{framework}", BENCHMARKS / f"native_{framework}.py")
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    return native


def unitrains(models, name: str):
    spec = MODELS.get(name)
    return models.build_vit(spec, 10) if name.startswith("vit") else models.ResNet(spec, 10)


def unitrain_imports(script: Path) -> set:
    names = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n.split(".")[0] in ("unitrain", "backends")}


@pytest.mark.parametrize("framework", ["paddle", "torch"])
def test_baselines_share_only_the_dataset_with_unitrain(framework):
    assert unitrain_imports(BENCHMARKS / f"native_{framework}.py") == {"unitrain.data.datasets"}


@pytest.mark.parametrize("name,size", SIZES)
def test_torch_baseline_is_unitrains_network(name, size):
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from backends.torch import models

    ours, theirs = unitrains(models, name), load("torch").build(name, 10, size)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}

    def flops(model):
        counter = FlopCounterMode(display=False)
        with counter:
            model(torch.zeros(2, 3, size, size)).sum().backward()
        return counter.get_total_flops()

    assert flops(ours) == flops(theirs) > 0


@pytest.mark.parametrize("name,size", SIZES)
def test_paddle_baseline_is_unitrains_network(name, size):
    import paddle

    from backends.paddle import models

    ours, theirs = unitrains(models, name), load("paddle").build(name, 10, size)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}

    def flops(model):
        # paddle.flops fails on paddle 3.3.1 with NumPy 2 (int() of a shape-[1] tensor), so the
        # multiply-adds of convolutions and the classifier are counted from their outputs here.
        counted = []

        def count(layer, inputs, output):
            weight = layer.weight
            per_output = (
                weight.shape[1] * weight.shape[2] * weight.shape[3]
                if isinstance(layer, paddle.nn.Conv2D)
                else weight.shape[0]
            )
            counted.append(2 * output.size * per_output)

        hooks = [
            m.register_forward_post_hook(count)
            for m in model.sublayers()
            if isinstance(m, (paddle.nn.Conv2D, paddle.nn.Linear))
        ]
        model(paddle.zeros([2, 3, size, size]))
        for hook in hooks:
            hook.remove()
        return sum(counted)

    assert flops(ours) == flops(theirs) > 0
