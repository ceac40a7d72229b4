"""ResNets built from unitrain.model.specs specs, with torchvision's layer names (conv1, bn1, layer1..4, fc)."""

from __future__ import annotations

import torch
from torch import nn

from unitrain.model.specs import ResNetSpec

__all__ = ["build_resnet", "linear_weights"]


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    return nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False), nn.BatchNorm2d(cout)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, width, 3, stride)
        self.conv2, self.bn2 = _conv_bn(width, width, 3)
        # One activation module per use: quantizers match patterns (conv-bn-relu, add-relu) per
        # module, and a module used twice reads as one node with two outputs.
        self.relu, self.relu_out = _relu(), _relu()
        self.downsample = _downsample(cin, width * self.expansion, stride)

    @property
    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu_out(out + identity)


class BottleneckBlock(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        # Stride on the 3x3 conv (ResNet v1.5), as torchvision and paddle.vision do.
        self.conv1, self.bn1 = _conv_bn(cin, width, 1)
        self.conv2, self.bn2 = _conv_bn(width, width, 3, stride)
        self.conv3, self.bn3 = _conv_bn(width, width * self.expansion, 1)
        self.relu, self.relu_mid, self.relu_out = _relu(), _relu(), _relu()
        self.downsample = _downsample(cin, width * self.expansion, stride)

    @property
    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu_mid(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu_out(out + identity)


def _relu() -> nn.ReLU:
    # In place, as torchvision: a new tensor per activation cost ResNet50 at 64x64 1-2% of a CPU
    # step on an AVX2 machine (516 against 505 ms) and about 7% on another (0.186 against 0.174 s).
    return nn.ReLU(inplace=True)


def _downsample(cin: int, cout: int, stride: int) -> nn.Sequential | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(*_conv_bn(cin, cout, 1, stride))


class ResNet(nn.Module):
    def __init__(self, spec: ResNetSpec, num_classes: int, zero_init_residual: bool = True):
        super().__init__()
        block = BottleneckBlock if spec.block == "bottleneck" else BasicBlock
        stem = spec.stem_layers
        self.conv1, self.bn1 = _conv_bn(3, spec.width, stem.kernel, stride=stem.stride)
        self.relu = _relu()
        # An Identity where the stem has no pool: forward() and the leaf layers stay the same for every stem.
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1) if stem.max_pool else nn.Identity()
        cin = spec.width
        for i, (width, depth) in enumerate(zip(spec.stage_widths(), spec.layers)):
            blocks = []
            for j in range(depth):
                blocks.append(block(cin, width, stride=2 if (i > 0 and j == 0) else 1))
                cin = width * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(spec.feature_dim, num_classes)
        self._init_weights(zero_init_residual)

    def _init_weights(self, zero_init_residual: bool) -> None:
        # The init scheme both backends share (torchvision's): Kaiming fan-out convs, unit BN.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            # Each residual branch starts as the identity; without it ResNet50 at small
            # batches and lr 0.1 diverges in its first steps (Goyal et al., 2017).
            for m in self.modules():
                if isinstance(m, (BasicBlock, BottleneckBlock)):
                    nn.init.zeros_(m.last_bn.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_resnet(spec: ResNetSpec, num_classes: int, zero_init_residual: bool) -> ResNet:
    return ResNet(spec, num_classes, zero_init_residual)


def linear_weights(model: nn.Module) -> list[str]:
    return [f"{name}.weight" if name else "weight" for name, m in model.named_modules() if isinstance(m, nn.Linear)]
