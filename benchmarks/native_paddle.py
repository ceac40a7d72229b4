"""A plain Paddle Fleet training script, in the style of Paddle's data-parallel tutorial
(paddle.vision.models, fleet.init, distributed_model, distributed_optimizer,
DistributedBatchSampler): the baseline for unitrain's overhead. Started alone, or by
paddle.distributed.launch. It shares nothing with unitrain but the dataset definition.
paddle.vision has no ViT: it is written here as PaddleClas writes its own (paddle.matmul
attention, nn.GELU)."""

from __future__ import annotations

import os
import warnings

warnings.filterwarnings("ignore", message="No ccache found")

import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
from paddle import nn  # noqa: E402
from paddle.distributed import fleet  # noqa: E402
from paddle.vision import models  # noqa: E402

from unitrain.data.datasets import SyntheticDataset  # noqa: E402


class Attention(nn.Layer):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        N, C = x.shape[1], x.shape[2]
        qkv = self.qkv(x).reshape((-1, N, 3, self.num_heads, C // self.num_heads)).transpose((2, 0, 3, 1, 4))
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = paddle.matmul(q, k.transpose((0, 1, 3, 2))) * self.scale
        attn = F.softmax(attn, axis=-1)
        x = paddle.matmul(attn, v).transpose((0, 2, 1, 3)).reshape((-1, N, C))
        return self.proj(x)


class Mlp(nn.Layer):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Layer):
    def __init__(self, dim, num_heads, mlp_ratio):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, dim * mlp_ratio)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class VisionTransformer(nn.Layer):
    def __init__(self, img_size, patch_size, embed_dim, depth, num_heads, mlp_ratio, num_classes):
        super().__init__()
        num_patches = (img_size // patch_size) ** 2
        trunc_normal = nn.initializer.TruncatedNormal(std=0.02)
        self.cls_token = self.create_parameter((1, 1, embed_dim), default_initializer=trunc_normal)
        self.pos_embed = self.create_parameter((1, num_patches + 1, embed_dim), default_initializer=trunc_normal)
        self.patch_embed = nn.Conv2D(3, embed_dim, patch_size, stride=patch_size)
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose((0, 2, 1))
        cls_tokens = self.cls_token.expand((x.shape[0], -1, -1))
        x = paddle.concat([cls_tokens, x], axis=1)
        x = x + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


# (patch_size, embed_dim, depth, num_heads, mlp_ratio)
VITS = {"vit_tiny": (4, 32, 2, 2, 2), "vit_small": (4, 192, 6, 3, 4)}


def build(name, num_classes, image_size=32):
    if name in VITS:
        return VisionTransformer(image_size, *VITS[name], num_classes)
    return getattr(models, name)(num_classes=num_classes)


def main():
    from native_common import StepTimer, parse_args

    args = parse_args()
    paddle.base.core.set_num_threads(args.threads)
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    if world > 1:
        fleet.init(is_collective=True, strategy=fleet.DistributedStrategy())
    paddle.seed(0)
    model = build(args.model, args.num_classes, args.image_size)
    optimizer = paddle.optimizer.Momentum(
        learning_rate=args.lr,
        momentum=0.9,
        parameters=model.parameters(),
        weight_decay=paddle.regularizer.L2Decay(1e-4),
    )
    if world > 1:  # fleet.distributed_model fails at world size 1 in paddle 3.3.1
        model = fleet.distributed_model(model)
        optimizer = fleet.distributed_optimizer(optimizer)
    data = SyntheticDataset(args.steps * args.batch_size * world, args.image_size, args.num_classes)
    sampler = paddle.io.DistributedBatchSampler(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
    loader = paddle.io.DataLoader(data, batch_sampler=sampler, num_workers=args.num_workers, return_list=True)
    model.train()
    timer = StepTimer()
    for step, (images, labels) in enumerate(loader):
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        timer.step()
        if step + 1 == args.steps:
            break
    if int(os.environ.get("PADDLE_TRAINER_ID", "0")) == 0:
        timer.write(args.out, last_loss=loss.item())


if __name__ == "__main__":
    main()
