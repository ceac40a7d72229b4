"""Framework-neutral model specifications: the ResNets and the Vision Transformers.

Both backends build their networks from these specs, so "resnet50" or "vit_small" is the same
architecture (layer order, widths, parameter names and count) on Paddle and on PyTorch by
construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple, Union

from unitrain.registry import Registry

#: ``model.name`` of a user's pair (:mod:`unitrain.model.custom`).
CUSTOM = "custom"


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


@dataclass(frozen=True)
class ViTSpec:
    """A Vision Transformer (Dosovitskiy et al.): patches embedded by a strided convolution, a
    class token and learned position embeddings, ``depth`` pre-norm blocks of multi-head
    self-attention and a GELU MLP, a final LayerNorm and a Linear head on the class token.
    Attention is written out (qkv Linear, softmax of scaled dot products, proj Linear) on both
    frameworks, so that AMP's lists and the quantizers see the same operators."""

    patch: int
    dim: int
    depth: int
    heads: int
    mlp_ratio: int = 4
    # The position embeddings depend on it: the data's image size, set when a job builds the model.
    image_size: int = 32

    @property
    def feature_dim(self) -> int:
        return self.dim

    @property
    def tokens(self) -> int:
        """Patches, plus the class token."""
        return (self.image_size // self.patch) ** 2 + 1


ModelSpec = Union[ResNetSpec, ViTSpec]
MODELS: Registry[ModelSpec] = Registry("model")
MODELS.register("resnet50", ResNetSpec("bottleneck", (3, 4, 6, 3)))
MODELS.register("resnet18", ResNetSpec("basic", (2, 2, 2, 2)))
MODELS.register("resnet18_cifar", ResNetSpec("basic", (2, 2, 2, 2), stem="cifar"))
MODELS.register("resnet18_stride2", ResNetSpec("basic", (2, 2, 2, 2), stem="stride2"))
# Small enough that a few CPU steps take well under a second: for tests and smoke runs.
MODELS.register("tiny", ResNetSpec("basic", (1, 1, 1, 1), width=8))
# Patch size 4 suits 32x32 images (64 patches; 28x28 Fashion-MNIST: 49). vit_tiny is for tests.
MODELS.register("vit_tiny", ViTSpec(patch=4, dim=32, depth=2, heads=2, mlp_ratio=2))
MODELS.register("vit_small", ViTSpec(patch=4, dim=192, depth=6, heads=3))
