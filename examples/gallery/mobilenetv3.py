"""A MobileNetV3 written as torchvision writes its own: ``partial`` batch norms with torch's eps
and momentum, Hardswish built with ``inplace=True``, squeeze-excitation gated by Hardsigmoid, and
an in-place dropout in the classifier."""

from functools import partial

import torch
from torch import nn
from torch.nn import functional as F


def make_divisible(v, divisor=8):
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class SqueezeExcitation(nn.Module):
    def __init__(self, channels, squeeze):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        scale = F.adaptive_avg_pool2d(x, 1)
        scale = F.hardsigmoid(self.fc2(self.relu(self.fc1(scale))), inplace=True)
        return scale * x


class InvertedResidual(nn.Module):
    def __init__(self, inp, kernel, expanded, out, use_se, use_hs, stride, norm_layer):
        super().__init__()
        self.use_res_connect = stride == 1 and inp == out
        activation = nn.Hardswish if use_hs else nn.ReLU
        layers = []
        if expanded != inp:
            layers += [nn.Conv2d(inp, expanded, 1, bias=False), norm_layer(expanded), activation(inplace=True)]
        layers += [
            nn.Conv2d(expanded, expanded, kernel, stride, (kernel - 1) // 2, groups=expanded, bias=False),
            norm_layer(expanded),
            activation(inplace=True),
        ]
        if use_se:
            layers.append(SqueezeExcitation(expanded, make_divisible(expanded // 4)))
        layers += [nn.Conv2d(expanded, out, 1, bias=False), norm_layer(out)]
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        result = self.block(x)
        return result + x if self.use_res_connect else result


class MobileNetV3(nn.Module):
    def __init__(self, num_classes=10, width=16, dropout=0.2):
        super().__init__()
        norm_layer = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)
        # (kernel, expanded, out, squeeze-excitation, hardswish, stride)
        settings = [(3, width, width, True, False, 2), (3, width * 4, width * 2, False, False, 2)]
        settings += [(5, width * 6, width * 2, True, True, 1), (5, width * 6, width * 3, True, True, 2)]
        layers = [nn.Conv2d(3, width, 3, 2, 1, bias=False), norm_layer(width), nn.Hardswish(inplace=True)]
        inp = width
        for kernel, expanded, out, se, hs, stride in settings:
            layers.append(InvertedResidual(inp, kernel, expanded, out, se, hs, stride, norm_layer))
            inp = out
        last = inp * 6
        layers += [nn.Conv2d(inp, last, 1, bias=False), norm_layer(last), nn.Hardswish(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(last, last * 2),
            nn.Hardswish(inplace=True),
            nn.Dropout(p=dropout, inplace=True),
            nn.Linear(last * 2, num_classes),
        )

    def forward(self, x):
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


def build(num_classes, image_size, width=16, dropout=0.2):
    return MobileNetV3(num_classes, width, dropout)
