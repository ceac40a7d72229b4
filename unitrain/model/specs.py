"""Framework-neutral ResNet specifications.

Both backends build their networks from these specs, so "resnet50" is the same architecture
(layer order, widths, strides, parameter count) on Paddle and on PyTorch by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from unitrain.registry import Registry


@dataclass(frozen=True)
class Stem:
    """The layers before layer1: one conv (kernel, stride), then a 3x3 stride-2 max-pool or none."""

    kernel: int
    stride: int
    max_pool: bool


STEMS: Registry[Stem] = Registry("stem")
# torchvision's, for ImageNet-sized images: a 32x32 image leaves layer1 8x8 maps and layer4 1x1.
STEMS.register("imagenet", Stem(7, 2, True))
# He et al.'s CIFAR networks' (and the usual "ResNet18 for CIFAR"): full resolution into layer1,
# at a cost: a step costs several times the ImageNet stem's on a CPU (docs/evaluation.md).
STEMS.register("cifar", Stem(3, 1, False))
# Between the two: one 3x3 stride-2 conv and no pool, so a 28x28 image leaves layer1 14x14 maps
# (the ImageNet stem: 8x8 from 32x32). Small maps use a CPU badly, so its step costs about what the
# ImageNet stem's does at 32x32 (docs/evaluation.md).
STEMS.register("stride2", Stem(3, 2, False))


@dataclass(frozen=True)
class ResNetSpec:
    # "basic": two 3x3 convs (ResNet18/34); "bottleneck": 1x1-3x3-1x1 with 4x expansion (ResNet50+).
    block: str
    layers: Tuple[int, int, int, int]
    width: int = 64
    # A name in STEMS. The stem changes conv1's kernel and drops the max-pool; the parameter names
    # stay the same, so weights convert between frameworks as for any other ResNet.
    stem: str = "imagenet"

    @property
    def stem_layers(self) -> Stem:
        return STEMS.get(self.stem)

    @property
    def expansion(self) -> int:
        return 4 if self.block == "bottleneck" else 1

    def stage_widths(self) -> Tuple[int, ...]:
        return tuple(self.width * 2**i for i in range(4))

    @property
    def feature_dim(self) -> int:
        return self.stage_widths()[-1] * self.expansion


MODELS: Registry[ResNetSpec] = Registry("model")
MODELS.register("resnet50", ResNetSpec("bottleneck", (3, 4, 6, 3)))
MODELS.register("resnet18", ResNetSpec("basic", (2, 2, 2, 2)))
MODELS.register("resnet18_cifar", ResNetSpec("basic", (2, 2, 2, 2), stem="cifar"))
MODELS.register("resnet18_stride2", ResNetSpec("basic", (2, 2, 2, 2), stem="stride2"))
# Small enough that a few CPU steps take well under a second: for tests and smoke runs.
MODELS.register("tiny", ResNetSpec("basic", (1, 1, 1, 1), width=8))
