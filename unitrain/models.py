"""Framework-neutral ResNet specifications.

Both backends build their networks from these specs, so "resnet50" is the same architecture
(layer order, widths, strides, parameter count) on Paddle and on PyTorch by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from unitrain.registry import Registry


@dataclass(frozen=True)
class ResNetSpec:
    # "basic": two 3x3 convs (ResNet18/34); "bottleneck": 1x1-3x3-1x1 with 4x expansion (ResNet50+).
    block: str
    layers: Tuple[int, int, int, int]
    width: int = 64

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
# Small enough that a few CPU steps take well under a second: for tests and smoke runs.
MODELS.register("tiny", ResNetSpec("basic", (1, 1, 1, 1), width=8))
