"""The same ResNet architecture on both frameworks."""

from __future__ import annotations

import numpy as np
import pytest

import unitrain
from unitrain.model.build import build_model

# Parameter counts of the reference torchvision models (1000 classes), an outside yardstick
# for "this really is ResNet18/ResNet50".
REFERENCE_PARAMS = {"resnet18": 11_689_512, "resnet50": 25_557_032}


@pytest.mark.parametrize("backend", ["paddle", "torch"])
@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_parameter_count_matches_reference(backend, name):
    b = unitrain.get_backend(backend)
    assert b.num_parameters(build_model(b, name, num_classes=1000)) == REFERENCE_PARAMS[name]


@pytest.mark.parametrize("backend", ["paddle", "torch"])
def test_cifar_stem_keeps_full_resolution_into_layer1(backend):
    """ResNet18 with the CIFAR stem: 11,173,962 parameters at 10 classes (the count of the usual
    CIFAR ResNet18, kuangliu/pytorch-cifar's), the same names as the ImageNet stem's, a 3x3 conv1,
    and 28x28 maps into layer1 where the ImageNet stem leaves 7x7."""
    b = unitrain.get_backend(backend)
    cifar, imagenet = build_model(b, "resnet18_cifar", num_classes=10), build_model(b, "resnet18", num_classes=10)
    assert b.num_parameters(cifar) == 11_173_962
    cifar_shapes = {k: tuple(v.shape) for k, v in b.state_arrays(cifar).items()}
    imagenet_shapes = {k: tuple(v.shape) for k, v in b.state_arrays(imagenet).items()}
    assert cifar_shapes.keys() == imagenet_shapes.keys()
    assert {k for k in cifar_shapes if cifar_shapes[k] != imagenet_shapes[k]} == {"conv1.weight"} and cifar_shapes[
        "conv1.weight"
    ][2:] == (3, 3)
    assert (_size_into_layer1(b, cifar, 28), _size_into_layer1(b, imagenet, 28)) == (28, 7)


@pytest.mark.parametrize("backend", ["paddle", "torch"])
def test_stride2_stem_halves_the_resolution_into_layer1_once(backend):
    """The stem tried for the Fashion-MNIST recipe: the CIFAR stem's parameters (a 3x3 conv1), but
    stride 2 and no pool, so a 28x28 image leaves 14x14 maps into layer1."""
    b = unitrain.get_backend(backend)
    model = build_model(b, "resnet18_stride2", num_classes=10)
    assert b.num_parameters(model) == 11_173_962
    assert tuple(b.state_arrays(model)["conv1.weight"].shape[2:]) == (3, 3)
    assert (_size_into_layer1(b, model, 28), _size_into_layer1(b, model, 32)) == (14, 16)


def _size_into_layer1(b, model, image_size: int) -> int:
    images, _ = next(iter(b.make_loader(unitrain.SyntheticDataset(2, image_size=image_size, num_classes=10), [[0, 1]])))
    with b.capture_outputs(model) as outputs:
        model(images)
    return dict(outputs)["maxpool"].shape[-1]


@pytest.mark.parametrize("name", ["tiny", "resnet18", "resnet18_cifar", "resnet18_stride2", "resnet50"])
def test_same_parameter_names_and_shapes_on_both_frameworks(name):
    paddle_model = build_model(unitrain.get_backend("paddle"), name, num_classes=7)
    torch_model = build_model(unitrain.get_backend("torch"), name, num_classes=7)
    paddle_shapes = {k: tuple(v.shape) for k, v in paddle_model.named_parameters() if not v.stop_gradient}
    torch_shapes = {k: tuple(v.shape) for k, v in torch_model.named_parameters()}
    assert paddle_shapes.keys() == torch_shapes.keys()
    for key, shape in torch_shapes.items():
        # Linear weights are stored [in, out] by paddle and [out, in] by torch.
        expected = shape[::-1] if key.endswith("fc.weight") else shape
        assert paddle_shapes[key] == expected, key


@pytest.mark.parametrize("backend", ["paddle", "torch"])
def test_forward_gives_logits_per_class(backend):
    b = unitrain.get_backend(backend)
    model = build_model(b, "tiny", num_classes=5, device="cpu")
    loader = b.make_loader(unitrain.SyntheticDataset(6, image_size=16, num_classes=5), [[0, 1, 2], [3, 4, 5]])
    images, labels = next(iter(loader))
    logits = b.to_numpy(model(images))
    assert logits.shape == (3, 5) and np.isfinite(logits).all()
    assert b.to_numpy(labels).tolist() == [unitrain.SyntheticDataset(6, 16, 5)[i][1] for i in range(3)]


def test_unknown_model_lists_the_available_ones():
    with pytest.raises(
        unitrain.UnknownNameError,
        match="available: gpt_mini, gpt_nano, resnet18, resnet18_cifar, resnet18_stride2, resnet50, tiny",
    ):
        build_model(unitrain.get_backend("torch"), "vgg16", num_classes=10)
