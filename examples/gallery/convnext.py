"""A ConvNeXt written as timm and torchvision write theirs: a 7x7 depthwise convolution, a
LayerNorm over channels last (``permute`` with separate dimensions), an inverted MLP, a learnable
layer scale and stochastic depth; downsampling through a channels-first LayerNorm of its own."""

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


def stochastic_depth(x, p, training):
    if not training or p == 0.0:
        return x
    survival_rate = 1.0 - p
    noise = torch.empty([x.shape[0]] + [1] * (x.ndim - 1), dtype=x.dtype, device=x.device)
    noise = noise.bernoulli_(survival_rate)
    if survival_rate > 0.0:
        noise.div_(survival_rate)
    return x * noise


class CNBlock(nn.Module):
    def __init__(self, dim, layer_scale, drop):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1) * layer_scale)
        self.drop = drop

    def forward(self, x):
        h = self.dwconv(x).permute(0, 2, 3, 1)
        h = self.pwconv2(self.act(self.pwconv1(self.norm(h))))
        h = self.layer_scale * h.permute(0, 3, 1, 2)
        return x + stochastic_depth(h, self.drop, self.training)


class ConvNeXt(nn.Module):
    def __init__(self, num_classes=10, dims=(16, 32), depths=(2, 2), layer_scale=1e-6, drop_path=0.1):
        super().__init__()
        layers = [nn.Conv2d(3, dims[0], kernel_size=2, stride=2), LayerNorm2d(dims[0], eps=1e-6)]
        total, index = sum(depths), 0
        for stage, (dim, depth) in enumerate(zip(dims, depths)):
            if stage:
                layers += [LayerNorm2d(dims[stage - 1], eps=1e-6), nn.Conv2d(dims[stage - 1], dim, 2, 2)]
            for _ in range(depth):
                layers.append(CNBlock(dim, layer_scale, drop_path * index / max(1, total - 1)))
                index += 1
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            LayerNorm2d(dims[-1], eps=1e-6), nn.Flatten(1), nn.Linear(dims[-1], num_classes)
        )
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)))


def build(num_classes, image_size, drop_path=0.1, layer_scale=1e-6):
    return ConvNeXt(num_classes, layer_scale=layer_scale, drop_path=drop_path)
