"""ResNets, ViTs and GPTs built from unitrain.spec.models specs, with the same layer names as the torch backend."""

from __future__ import annotations

import math
import warnings

import paddle
from paddle import nn
from paddle.nn import functional as F

from unitrain.spec.models import GPTSpec, ResNetSpec, ViTSpec

__all__ = ["buffer_names", "build_gpt", "build_resnet", "build_vit", "is_model", "linear_weights"]

# (place, dtype, layout) -> whether Paddle's batch_norm op there folds in the biased variance.
_BIASED_VARIANCE: dict = {}


def _op_folds_biased_variance(x: paddle.Tensor, data_format: str) -> bool:
    """Whether Paddle's batch_norm op, where ``x`` lives, folds the biased batch variance into the
    running variance. Observed once per place, dtype and layout on four values (0, 1, 2, 3:
    biased variance 1.25, unbiased 1.67): Paddle's CPU kernel folds the biased one, while on CUDA
    its 4-D inputs go to cuDNN (cudnnBatchNormalizationForwardTrainingEx), whose running variance
    may be the unbiased one already, not to be corrected twice."""
    key = (str(x.place), str(x.dtype), data_format)
    if key not in _BIASED_VARIANCE:
        shape = (2, 1, 2, 1) if data_format == "NCHW" else (2, 2, 1, 1)
        probe = paddle.to_tensor([0.0, 1.0, 2.0, 3.0], dtype=x.dtype, place=x.place).reshape(shape)
        mean, var = (paddle.zeros([1], dtype="float32").to(x.place) for _ in range(2))
        F.batch_norm(probe, mean, var, training=True, momentum=0.0, data_format=data_format)
        folded = float(var.numpy().reshape(-1)[0])
        _BIASED_VARIANCE[key] = abs(folded - 1.25) < abs(folded - 5.0 / 3.0)
    return _BIASED_VARIANCE[key]


def _static_op_folds_biased_variance(data_format: str) -> bool:
    """The same, while paddle.jit.to_static traces (no value to observe): what was observed in
    this process on the device, else Paddle's CPU kernel's definition on a CPU only."""
    device = paddle.get_device()
    seen = [v for (place, _, fmt), v in _BIASED_VARIANCE.items() if device in place and fmt == data_format]
    return seen[0] if seen else device == "cpu"


class BatchNorm2D(nn.BatchNorm2D):
    """Paddle's BatchNorm2D with torch's running variance: the unbiased batch variance.

    Paddle's CPU kernel folds the biased variance of each batch (its sum of squares over n, the
    values a channel has: batch x height x width) into its running variance, torch the unbiased
    one (over n - 1). Evaluation, export and inference use the running variance, so the same
    training would give the two frameworks different models: 1/(n-1) apart, 0.8% of the variance
    in ResNet18's last stage at batch 128 and 32x32 images, 3% at 8 images a rank and 2x2 maps.
    Where Paddle's op already folds the unbiased one (cuDNN), this layer is Paddle's own.
    Training itself (on the batch's statistics) is unchanged.
    """

    def _paddles_own(self, x: paddle.Tensor) -> paddle.Tensor:
        # Paddle's layer repeats on each training forward that it tracks running statistics,
        # which is the documented behaviour both backends share.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="When training, we now always track global mean and variance")
            # Named, not super(): Paddle's to_static rewrites super() as super(type(self), self),
            # which a subclass (translate.TorchBatchNorm2d) would send back here for ever.
            return nn.BatchNorm2D.forward(self, x)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if not self.training or self._use_global_stats:
            return self._paddles_own(x)
        self._check_input_dim(x)
        m = self._momentum
        if not paddle.in_dynamic_mode():  # paddle.jit.to_static: the batch size may be a variable
            if not _static_op_folds_biased_variance(self._data_format):
                return self._paddles_own(x)
            running = self._variance.detach().clone()
            out = F.batch_norm(
                x, self._mean, running, self.weight, self.bias, True, m, self._epsilon, self._data_format
            )
            n = paddle.cast(x.numel() // self._num_features, running.dtype)
            # Paddle wrote m * before + (1 - m) * biased; torch's has biased * n / (n - 1) instead.
            paddle.assign((running * n - self._variance * m) / (n - 1), self._variance)
            return out
        n = math.prod(x.shape) // self._num_features
        if n < 2 or not _op_folds_biased_variance(x, self._data_format):
            return self._paddles_own(x)
        k = n / (n - 1)
        # Paddle's op updates its variance input to m * input + (1 - m) * biased; given
        # before / k, that is exactly torch's value / k. The op keeps its variance input for the
        # backward pass and refuses one changed in place afterwards, so the layer's variance takes
        # the buffer of a new tensor, which costs no more than Paddle's own layer (copying the
        # value back in place nearly doubled its cost).
        running = self._variance.scale(1.0 / k)
        out = F.batch_norm(x, self._mean, running, self.weight, self.bias, True, m, self._epsilon, self._data_format)
        running.scale(k)._share_buffer_to(self._variance)
        return out


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> tuple[nn.Conv2D, BatchNorm2D]:
    # paddle's BN momentum 0.9 is torch's 0.1 (weight of the running value vs. of the batch).
    return nn.Conv2D(cin, cout, kernel, stride=stride, padding=kernel // 2, bias_attr=False), BatchNorm2D(cout)


class _Residual(nn.Layer):
    """A ResNet block: its branch (:meth:`branch`: conv-BN pairs with ReLUs between) added to the
    shortcut (the input, or its downsampling), then a ReLU."""

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
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
        self.relu, self.relu_out = nn.ReLU(), nn.ReLU()
        self.downsample = _downsample(cin, width * self.expansion, stride)

    @property
    def last_bn(self) -> nn.BatchNorm2D:
        return self.bn2

    def branch(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))


class BottleneckBlock(_Residual):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        # Stride on the 3x3 conv (ResNet v1.5), as paddle.vision and torchvision do.
        self.conv1, self.bn1 = _conv_bn(cin, width, 1)
        self.conv2, self.bn2 = _conv_bn(width, width, 3, stride)
        self.conv3, self.bn3 = _conv_bn(width, width * self.expansion, 1)
        self.relu, self.relu_mid, self.relu_out = nn.ReLU(), nn.ReLU(), nn.ReLU()
        self.downsample = _downsample(cin, width * self.expansion, stride)

    @property
    def last_bn(self) -> nn.BatchNorm2D:
        return self.bn3

    def branch(self, x: paddle.Tensor) -> paddle.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu_mid(self.bn2(self.conv2(out)))
        return self.bn3(self.conv3(out))


def _downsample(cin: int, cout: int, stride: int) -> nn.Sequential | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(*_conv_bn(cin, cout, 1, stride))


class ResNet(nn.Layer):
    def __init__(self, spec: ResNetSpec, num_classes: int, zero_init_residual: bool = True):
        super().__init__()
        block = BottleneckBlock if spec.block == "bottleneck" else BasicBlock
        stem = spec.stem_layers
        self.conv1, self.bn1 = _conv_bn(3, spec.width, stem.kernel, stride=stem.stride)
        self.relu = nn.ReLU()
        # An Identity where the stem has no pool: forward() and the leaf layers stay the same for every stem.
        self.maxpool = nn.MaxPool2D(3, stride=2, padding=1) if stem.max_pool else nn.Identity()
        cin = spec.width
        for i, (width, depth) in enumerate(zip(spec.stage_widths(), spec.layers)):
            blocks = []
            for j in range(depth):
                blocks.append(block(cin, width, stride=2 if (i > 0 and j == 0) else 1))
                cin = width * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2D(1)
        self.fc = nn.Linear(spec.feature_dim, num_classes)
        self._init_weights(zero_init_residual)

    def _init_weights(self, zero_init_residual: bool) -> None:
        # The init scheme both backends share (torchvision's): Kaiming fan-out convs, unit BN.
        for m in self.sublayers():
            if isinstance(m, nn.Conv2D):
                fan_out = m.weight.shape[0] * m.weight.shape[2] * m.weight.shape[3]
                nn.initializer.KaimingNormal(fan_in=fan_out, nonlinearity="relu")(m.weight)
            elif isinstance(m, nn.BatchNorm2D):
                nn.initializer.Constant(1.0)(m.weight)
                nn.initializer.Constant(0.0)(m.bias)
        if zero_init_residual:
            # Each residual branch starts as the identity; without it ResNet50 at small
            # batches and lr 0.1 diverges in its first steps (Goyal et al., 2017).
            for m in self.sublayers():
                if isinstance(m, (BasicBlock, BottleneckBlock)):
                    nn.initializer.Constant(0.0)(m.last_bn.weight)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(paddle.flatten(self.avgpool(x), 1))


def build_resnet(spec: ResNetSpec, num_classes: int, zero_init_residual: bool) -> ResNet:
    return ResNet(spec, num_classes, zero_init_residual)


def is_model(obj: object) -> bool:
    return isinstance(obj, nn.Layer)


def buffer_names(model: nn.Layer) -> list[str]:
    return [name for name, _ in model.named_buffers()]


def linear_weights(model: nn.Layer) -> list[str]:
    return [
        f"{name}.weight" if name else "weight"
        for name, m in model.named_sublayers(include_self=True)
        if isinstance(m, nn.Linear)
    ]


class Attention(nn.Layer):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.softmax = nn.Softmax(axis=-1)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        d, h = x.shape[-1], self.heads
        # One split of the projection's last axis, then each part to [batch, heads, tokens, d/h]:
        # 8% less of a GPT step than one 5-D transpose and an unbind (whose backward stacks the
        # three gradients), and slices of the transposed qkv were worse still (each backward fills
        # a zero tensor the size of all of qkv). 0 copies the input's dimension: batch and tokens
        # stay free for an export at any batch.
        q, k, v = (t.reshape([0, 0, h, d // h]).transpose([0, 2, 1, 3]) for t in paddle.split(self.qkv(x), 3, -1))
        # The @ operator, not paddle.matmul: the legacy program that Paddle's quantized models are
        # saved in (backends/paddle/quantize.py) takes only the operator between two activations.
        attn = self.attend((q @ k.transpose([0, 1, 3, 2])) * self.scale)
        return self.project((attn @ v).transpose([0, 2, 1, 3]).reshape([0, 0, d]))

    def attend(self, scores: paddle.Tensor) -> paddle.Tensor:
        return self.softmax(scores)

    def project(self, heads: paddle.Tensor) -> paddle.Tensor:
        return self.proj(heads)


class Mlp(nn.Layer):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        # Paddle's own exact GELU, one kernel each way (the legacy program of the int8 path gets
        # its legacy operator from backends/paddle/quantize.py); written out through erf, five
        # elementwise ops and their backwards cost a language model's step about a tenth.
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _PreNorm(nn.Layer):
    """A transformer block (ViT's, GPT's): attention, then the MLP, each on the normalised input
    and added to it."""

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Block(_PreNorm):
    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim), Mlp(dim, dim * mlp_ratio)


class VisionTransformer(nn.Layer):
    def __init__(self, spec: ViTSpec, num_classes: int):
        super().__init__()
        init = nn.initializer.TruncatedNormal(std=0.02)
        self.cls_token = self.create_parameter([1, 1, spec.dim], default_initializer=init)
        self.pos_embed = self.create_parameter([1, spec.tokens, spec.dim], default_initializer=init)
        self.patch_embed = nn.Conv2D(3, spec.dim, spec.patch, stride=spec.patch)
        self.blocks = nn.Sequential(*(Block(spec.dim, spec.heads, spec.mlp_ratio) for _ in range(spec.depth)))
        self.norm, self.head = nn.LayerNorm(spec.dim), nn.Linear(spec.dim, num_classes)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        x = self.patch_embed(x).flatten(2).transpose([0, 2, 1])
        # The class token broadcast over the batch by adding zeros: exact, and any batch size
        # exports (expand would fix it).
        cls = self.cls_token + paddle.zeros_like(x[:, :1, :])
        x = paddle.concat([cls, x], axis=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


def build_vit(spec: ViTSpec, num_classes: int) -> VisionTransformer:
    return VisionTransformer(spec, num_classes)


def _dropout(p: float) -> nn.Layer:
    # No layer at all where there is none to apply: nothing is drawn, nothing is exported.
    return nn.Dropout(p) if p > 0 else nn.Identity()


class CausalSelfAttention(Attention):
    """The ViT's attention where position t attends to positions <= t only, with nanoGPT's
    dropout on the attention weights and on the output projection."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__(dim, heads)
        self.attn_drop, self.proj_drop = _dropout(dropout), _dropout(dropout)

    def attend(self, scores: paddle.Tensor) -> paddle.Tensor:
        # -inf above the diagonal, shaped like the scores' own [time, time]: no buffer fixed at
        # block_size in the state, and the time axis stays dynamic for an export.
        mask = paddle.triu(paddle.full_like(scores[0, 0], float("-inf")), diagonal=1)
        return self.attn_drop(self.softmax(scores + mask))

    def project(self, heads: paddle.Tensor) -> paddle.Tensor:
        return self.proj_drop(self.proj(heads))


class GPTMlp(Mlp):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__(dim, hidden)
        self.drop = _dropout(dropout)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.drop(super().forward(x))


class GPTBlock(_PreNorm):
    def __init__(self, spec: GPTSpec):
        super().__init__()
        d = spec.dim
        self.norm1, self.attn = nn.LayerNorm(d), CausalSelfAttention(d, spec.heads, spec.dropout)
        self.norm2, self.mlp = nn.LayerNorm(d), GPTMlp(d, d * spec.mlp_ratio, spec.dropout)


class GPT(nn.Layer):
    def __init__(self, spec: GPTSpec, vocab_size: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, spec.dim), nn.Embedding(spec.block_size, spec.dim)
        self.drop = _dropout(spec.dropout)
        self.blocks = nn.Sequential(*(GPTBlock(spec) for _ in range(spec.depth)))
        self.norm = nn.LayerNorm(spec.dim)
        self._init_weights(spec.depth)

    def _init_weights(self, depth: int) -> None:
        # nanoGPT's (GPT-2's): N(0, 0.02) weights, zero biases, unit LayerNorms.
        normal, zero = nn.initializer.Normal(0.0, 0.02), nn.initializer.Constant(0.0)
        for m in self.sublayers():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                normal(m.weight)
            if isinstance(m, nn.Linear):
                zero(m.bias)
        # Each block's two branches add to the residual stream; their last layers start smaller so
        # that the stream's variance does not grow with depth.
        residual = nn.initializer.Normal(0.0, 0.02 / math.sqrt(2 * depth))
        for block in self.blocks:
            for weight in (block.attn.proj.weight, block.mlp.fc2.weight):
                residual(weight)

    def forward(self, idx: paddle.Tensor) -> paddle.Tensor:
        # The length as a tensor, not idx.shape[1]: a traced program keeps the time axis free.
        pos = paddle.arange(paddle.shape(idx)[1], dtype="int64")
        x = self.drop(self.wte(idx) + self.wpe(pos))
        # The head is the token embedding (tied): logits = x @ wte^T.
        return paddle.matmul(self.norm(self.blocks(x)), self.wte.weight, transpose_y=True)


def build_gpt(spec: GPTSpec, vocab_size: int) -> GPT:
    return GPT(spec, vocab_size)
