"""A DenseNet written as torchvision writes its own: each layer's input the concatenation of every
earlier output (``torch.cat``), functional ``F.relu(..., inplace=True)`` and dropout with
``training=self.training``, transitions that halve the size with average pooling."""

import torch
import torch.nn.functional as F
from torch import nn


class DenseLayer(nn.Module):
    def __init__(self, inputs, growth, bn_size, drop_rate):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(inputs)
        self.conv1 = nn.Conv2d(inputs, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)
        self.drop_rate = float(drop_rate)

    def forward(self, features):
        x = torch.cat(features, 1)
        x = self.conv1(F.relu(self.norm1(x), inplace=True))
        x = self.conv2(F.relu(self.norm2(x), inplace=True))
        if self.drop_rate > 0:
            x = F.dropout(x, p=self.drop_rate, training=self.training)
        return x


class DenseBlock(nn.ModuleDict):
    def __init__(self, layers, inputs, growth, bn_size, drop_rate):
        super().__init__()
        for i in range(layers):
            self.add_module(f"denselayer{i + 1}", DenseLayer(inputs + i * growth, growth, bn_size, drop_rate))

    def forward(self, x):
        features = [x]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class Transition(nn.Sequential):
    def __init__(self, inputs, outputs):
        super().__init__()
        self.norm = nn.BatchNorm2d(inputs)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(inputs, outputs, 1, bias=False)
        self.pool = nn.AvgPool2d(2, 2)


class DenseNet(nn.Module):
    def __init__(self, num_classes=10, growth=8, blocks=(2, 2, 2), init_features=16, bn_size=2, drop_rate=0.1):
        super().__init__()
        self.features = nn.Sequential()
        self.features.add_module("conv0", nn.Conv2d(3, init_features, 3, 1, 1, bias=False))
        self.features.add_module("norm0", nn.BatchNorm2d(init_features))
        self.features.add_module("relu0", nn.ReLU(inplace=True))
        channels = init_features
        for i, layers in enumerate(blocks):
            self.features.add_module(f"denseblock{i + 1}", DenseBlock(layers, channels, growth, bn_size, drop_rate))
            channels += layers * growth
            if i != len(blocks) - 1:
                self.features.add_module(f"transition{i + 1}", Transition(channels, channels // 2))
                channels //= 2
        self.features.add_module("norm5", nn.BatchNorm2d(channels))
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x):
        out = F.relu(self.features(x), inplace=True)
        out = torch.flatten(F.adaptive_avg_pool2d(out, (1, 1)), 1)
        return self.classifier(out)


def build(num_classes, image_size, drop_rate=0.1):
    return DenseNet(num_classes, drop_rate=drop_rate)
