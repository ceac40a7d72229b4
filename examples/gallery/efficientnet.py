"""An EfficientNet written as torchvision writes its own: norm layers passed as ``partial``,
activations built with ``inplace=True``, squeeze-excitation, stochastic depth on the residual
branches and an in-place dropout before the classifier."""

import math
from functools import partial

import torch
from torch import nn


def stochastic_depth(x, p, training):
    """Drops whole samples of a residual branch, keeping the expectation (torchvision's rule)."""
    if not training or p == 0.0:
        return x
    survival_rate = 1.0 - p
    noise = torch.empty([x.shape[0], 1, 1, 1], dtype=x.dtype, device=x.device)
    noise = noise.bernoulli_(survival_rate)
    noise.div_(survival_rate)
    return x * noise


class StochasticDepth(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        return stochastic_depth(x, self.p, self.training)


class ConvNormActivation(nn.Sequential):
    def __init__(self, in_ch, out_ch, kernel_size=3, stride=1, groups=1, norm_layer=None, activation_layer=nn.SiLU):
        layers = [nn.Conv2d(in_ch, out_ch, kernel_size, stride, (kernel_size - 1) // 2, groups=groups, bias=False)]
        if norm_layer is not None:
            layers.append(norm_layer(out_ch))
        if activation_layer is not None:
            layers.append(activation_layer(inplace=True))
        super().__init__(*layers)
        self.out_channels = out_ch


class SqueezeExcitation(nn.Module):
    def __init__(self, channels, squeeze, activation=nn.SiLU, scale_activation=nn.Sigmoid):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class MBConv(nn.Module):
    def __init__(self, in_ch, out_ch, expand_ratio, kernel, stride, drop, norm_layer):
        super().__init__()
        self.use_res_connect = stride == 1 and in_ch == out_ch
        hidden = in_ch * expand_ratio
        layers = []
        if hidden != in_ch:
            layers.append(ConvNormActivation(in_ch, hidden, 1, norm_layer=norm_layer))
        layers += [
            ConvNormActivation(hidden, hidden, kernel, stride, groups=hidden, norm_layer=norm_layer),
            SqueezeExcitation(hidden, max(1, in_ch // 4)),
            ConvNormActivation(hidden, out_ch, 1, norm_layer=norm_layer, activation_layer=None),
        ]
        self.block = nn.Sequential(*layers)
        self.stochastic_depth = StochasticDepth(drop)

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result = self.stochastic_depth(result)
            result += x
        return result


class EfficientNet(nn.Module):
    def __init__(self, num_classes=10, width=16, drop_path=0.2, dropout=0.2):
        super().__init__()
        norm_layer = partial(nn.BatchNorm2d, eps=1e-3, momentum=0.01)
        # (expand ratio, kernel, stride, out channels, repeats)
        stages = [(1, 3, 1, width, 1), (4, 3, 2, width * 2, 2), (4, 5, 2, width * 3, 2)]
        total = sum(s[-1] for s in stages)
        layers = [ConvNormActivation(3, width, 3, 2, norm_layer=norm_layer)]
        in_ch, index = width, 0
        for expand, kernel, stride, out_ch, repeats in stages:
            for i in range(repeats):
                drop = drop_path * index / total
                layers.append(MBConv(in_ch, out_ch, expand, kernel, stride if i == 0 else 1, drop, norm_layer))
                in_ch, index = out_ch, index + 1
        head = in_ch * 4
        layers.append(ConvNormActivation(in_ch, head, 1, norm_layer=norm_layer))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout, inplace=True), nn.Linear(head, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                bound = 1.0 / math.sqrt(m.out_features)
                nn.init.uniform_(m.weight, -bound, bound)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def build(num_classes, image_size, width=16, drop_path=0.2, dropout=0.2):
    return EfficientNet(num_classes, width, drop_path, dropout)
