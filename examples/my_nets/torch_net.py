# The model in PyTorch: the half a team trains today.
import torch


class TorchNet(torch.nn.Module):
    def __init__(self, num_classes=10, image_size=32, width=16):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(width)
        self.conv2 = torch.nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(2 * width)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc1 = torch.nn.Linear(2 * width, 64)
        self.fc2 = torch.nn.Linear(64, num_classes)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        x = torch.flatten(self.pool(x), 1)
        return self.fc2(torch.relu(self.fc1(x)))


def build(num_classes, image_size, width=16):
    return TorchNet(num_classes, image_size, width)
