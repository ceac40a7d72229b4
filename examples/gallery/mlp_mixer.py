import torch.nn as nn


class MixerBlock(nn.Module):
    def __init__(self, num_patches, dim, token_hidden, channel_hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mix = nn.Sequential(
            nn.Linear(num_patches, token_hidden), nn.GELU(), nn.Linear(token_hidden, num_patches)
        )
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mix = nn.Sequential(nn.Linear(dim, channel_hidden), nn.GELU(), nn.Linear(channel_hidden, dim))

    def forward(self, x):
        x = x + self.token_mix(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mix(self.norm2(x))


class MLPMixer(nn.Module):
    def __init__(self, image_size=32, patch_size=4, dim=32, depth=2, num_classes=10):
        super().__init__()
        num_patches = (image_size // patch_size) ** 2
        self.stem = nn.Conv2d(3, dim, patch_size, patch_size)
        self.blocks = nn.Sequential(*[MixerBlock(num_patches, dim, dim // 2, dim * 2) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))


def build(num_classes, image_size, dim=32, depth=2, patch_size=4):
    return MLPMixer(image_size, patch_size, dim, depth, num_classes)
