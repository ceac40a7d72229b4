"""ResNets built from unitrain.spec.models specs, with torchvision's layer names (conv1, bn1, layer1..4, fc);
ViTs and GPTs with the same names as the Paddle backend's."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from unitrain.spec.models import GPTSpec, ResNetSpec, ViTSpec

__all__ = ["buffer_names", "build_gpt", "build_resnet", "build_vit", "is_model", "linear_weights"]


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    return nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False), nn.BatchNorm2d(cout)


class _Residual(nn.Module):
    """A ResNet block: its branch (:meth:`branch`: conv-BN pairs with ReLUs between) added to the
    shortcut (the input, or its downsampling), then a ReLU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu_out(self.branch(x) + identity)


class BasicBlock(_Residual):
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

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))


class BottleneckBlock(_Residual):
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

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu_mid(self.bn2(self.conv2(out)))
        return self.bn3(self.conv3(out))


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


def is_model(obj: object) -> bool:
    return isinstance(obj, nn.Module)


def buffer_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_buffers()]


def linear_weights(model: nn.Module) -> list[str]:
    return [f"{name}.weight" if name else "weight" for name, m in model.named_modules() if isinstance(m, nn.Linear)]


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # One unbind, not three selects: each select's backward fills a zero tensor the size of
        # all of qkv (3% of vit_small's step on a CPU).
        q, k, v = qkv.unbind(0)
        attn = self.attend(torch.matmul(q, k.transpose(-2, -1)) * self.scale)
        return self.project(torch.matmul(attn, v).transpose(1, 2).reshape(b, n, d))

    def attend(self, scores: torch.Tensor) -> torch.Tensor:
        return self.softmax(scores)

    def project(self, heads: torch.Tensor) -> torch.Tensor:
        return self.proj(heads)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _PreNorm(nn.Module):
    """A transformer block (ViT's, GPT's): attention, then the MLP, each on the normalised input
    and added to it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Block(_PreNorm):
    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim), Mlp(dim, dim * mlp_ratio)


class VisionTransformer(nn.Module):
    def __init__(self, spec: ViTSpec, num_classes: int):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, spec.dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, spec.tokens, spec.dim))
        self.patch_embed = nn.Conv2d(3, spec.dim, spec.patch, stride=spec.patch)
        self.blocks = nn.Sequential(*(Block(spec.dim, spec.heads, spec.mlp_ratio) for _ in range(spec.depth)))
        self.norm, self.head = nn.LayerNorm(spec.dim), nn.Linear(spec.dim, num_classes)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


def build_vit(spec: ViTSpec, num_classes: int) -> VisionTransformer:
    return VisionTransformer(spec, num_classes)


def _dropout(p: float) -> nn.Module:
    # No layer at all where there is none to apply: nothing is drawn, nothing is exported.
    return nn.Dropout(p) if p > 0 else nn.Identity()


class CausalSelfAttention(Attention):
    """The ViT's attention where position t attends to positions <= t only, with nanoGPT's
    dropout on the attention weights and on the output projection."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__(dim, heads)
        self.attn_drop, self.proj_drop = _dropout(dropout), _dropout(dropout)

    def attend(self, scores: torch.Tensor) -> torch.Tensor:
        # -inf above the diagonal, shaped like the scores' own [time, time]: no buffer fixed at
        # block_size in the state, and the time axis stays dynamic for an export.
        mask = torch.full_like(scores[0, 0], float("-inf")).triu(1)
        return self.attn_drop(self.softmax(scores + mask))

    def project(self, heads: torch.Tensor) -> torch.Tensor:
        return self.proj_drop(self.proj(heads))


class GPTMlp(Mlp):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__(dim, hidden)
        self.drop = _dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(super().forward(x))


class GPTBlock(_PreNorm):
    def __init__(self, spec: GPTSpec):
        super().__init__()
        d = spec.dim
        self.norm1, self.attn = nn.LayerNorm(d), CausalSelfAttention(d, spec.heads, spec.dropout)
        self.norm2, self.mlp = nn.LayerNorm(d), GPTMlp(d, d * spec.mlp_ratio, spec.dropout)


class GPT(nn.Module):
    def __init__(self, spec: GPTSpec, vocab_size: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, spec.dim), nn.Embedding(spec.block_size, spec.dim)
        self.drop = _dropout(spec.dropout)
        self.blocks = nn.Sequential(*(GPTBlock(spec) for _ in range(spec.depth)))
        self.norm = nn.LayerNorm(spec.dim)
        self._init_weights(spec.depth)

    def _init_weights(self, depth: int) -> None:
        # nanoGPT's (GPT-2's): N(0, 0.02) weights, zero biases, unit LayerNorms.
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        # Each block's two branches add to the residual stream; their last layers start smaller so
        # that the stream's variance does not grow with depth.
        for block in self.blocks:
            for weight in (block.attn.proj.weight, block.mlp.fc2.weight):
                nn.init.normal_(weight, 0.0, 0.02 / math.sqrt(2 * depth))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        # The head is the token embedding (tied): logits = x @ wte^T.
        return F.linear(self.norm(self.blocks(x)), self.wte.weight)


def build_gpt(spec: GPTSpec, vocab_size: int) -> GPT:
    return GPT(spec, vocab_size)
