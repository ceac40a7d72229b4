"""Framework-neutral model specifications: the ResNets, the Vision Transformers and the GPTs.

Both backends build their networks from these specs, so "resnet50" or "vit_small" is the same
architecture (layer order, widths, parameter names and count) on Paddle and on PyTorch by
construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple, Union

from unitrain.registry import Registry
from unitrain.spec.hf import HF

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


@dataclass(frozen=True)
class GPTSpec:
    """A decoder-only language model, nanoGPT's shape: token and learned position embeddings,
    ``depth`` pre-norm blocks of causal multi-head self-attention (written out as the ViT's) and a
    GELU MLP, a final LayerNorm, and a head tied to the token embedding (logits = x @ wte^T), so
    the vocabulary costs one matrix. The vocabulary's size is the data's (``num_classes``)."""

    # Sizes named as ViTSpec's on purpose, not shared through a base: each spec reads whole in one place.
    dim: int
    depth: int
    heads: int
    # The context length: the position embeddings' rows, the longest sequence the model takes.
    block_size: int
    mlp_ratio: int = 4
    # Of the embeddings, the attention weights and the residual branches' outputs, in training.
    dropout: float = 0.0

    @property
    def feature_dim(self) -> int:
        """What the (tied) head reads, as a classifier's features: the memory check sizes it."""
        return self.dim

    def num_parameters(self, vocab_size: int) -> int:
        """What the built model holds: no head matrix, it is the token embedding's."""
        d, hidden = self.dim, self.dim * self.mlp_ratio
        norms = 2 * 2 * d
        attention = (d * 3 * d + 3 * d) + (d * d + d)  # qkv, proj
        mlp = (d * hidden + hidden) + (hidden * d + d)  # fc1, fc2
        return (vocab_size + self.block_size) * d + self.depth * (norms + attention + mlp) + 2 * d


ModelSpec = Union[ResNetSpec, ViTSpec, GPTSpec]
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
# nanoGPT's shape. gpt_nano is for tests; gpt_mini is its CPU recipe (shakespeare_char on a laptop).
MODELS.register("gpt_nano", GPTSpec(dim=64, depth=2, heads=2, block_size=32))
MODELS.register("gpt_mini", GPTSpec(dim=128, depth=4, heads=4, block_size=64))


def is_language_model(name: str) -> bool:
    """Whether ``model.name`` names a language model: token ids in, next-token logits out."""
    return name == HF or (name in MODELS and isinstance(MODELS.get(name), GPTSpec))
