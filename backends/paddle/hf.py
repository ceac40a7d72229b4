"""model=hf on Paddle: the supported Hugging Face families written once for Paddle, with the
checkpoint's own parameter names, computing what transformers' classes compute (the torch half,
``backends/torch/hf.py``, is transformers itself): LLaMA (and Mistral without sliding windows),
Qwen2 (q/k/v biases), Qwen3 (RMSNorm of each head's queries and keys) and GPT-2. Rotary
embeddings as transformers computes them (the inverse frequencies and angles in float32, the two
halves rotated), grouped key/value heads repeated per query head, attention written out (scaled
scores, a causal mask, softmax in float32). Paddle's Linear weights are [in, out]: the
checkpoint's Linear weights are transposed on the way in and out (GPT-2's Conv1D weights are
[in, out] already). No dropout (the torch half's is set to 0)."""

from __future__ import annotations

import math
from typing import Dict, List

import numpy as np
import paddle
from paddle import nn
from paddle.nn import functional as F

from unitrain.errors import ConfigError
from unitrain.spec.hf import HfSpec, expected_shapes, linear_names

__all__ = ["build_hf", "hf_linear_weights", "hf_state"]


class RMSNorm(nn.Layer):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = self.create_parameter([dim], default_initializer=nn.initializer.Constant(1.0))

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * paddle.rsqrt(variance + self.eps))


def _linear(cin: int, cout: int, bias: bool) -> nn.Linear:
    return nn.Linear(cin, cout, bias_attr=None if bias else False)


def _rope(length: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [length, head_dim] as transformers' default rotary embedding computes them."""
    inv_freq = (1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))).astype(
        np.float32
    )
    freqs = np.arange(length, dtype=np.float32)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def _rotate_half(x: paddle.Tensor) -> paddle.Tensor:
    half = x.shape[-1] // 2
    return paddle.concat([-x[..., half:], x[..., :half]], axis=-1)


def _causal_attention(q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, scale: float) -> paddle.Tensor:
    """softmax(q kᵀ · scale + causal mask) v over [batch, heads, time, head_dim]."""
    t = q.shape[2]
    scores = paddle.matmul(q, k, transpose_y=True) * scale
    mask = paddle.to_tensor(np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1))
    weights = F.softmax(scores + mask, axis=-1)
    return paddle.matmul(weights, v)


class Attention(nn.Layer):
    def __init__(self, spec: HfSpec):
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.heads, self.kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, d
        self.q_proj = _linear(h, spec.num_heads * d, spec.qkv_bias)
        self.k_proj = _linear(h, spec.num_kv_heads * d, spec.qkv_bias)
        self.v_proj = _linear(h, spec.num_kv_heads * d, spec.qkv_bias)
        self.o_proj = _linear(spec.num_heads * d, h, spec.o_bias)
        if spec.qk_norm:
            self.q_norm = RMSNorm(d, spec.norm_eps)
            self.k_norm = RMSNorm(d, spec.norm_eps)
        self.qk_norm = spec.qk_norm

    def forward(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
        b, t = x.shape[0], x.shape[1]
        q = self.q_proj(x).reshape([b, t, self.heads, self.head_dim])
        k = self.k_proj(x).reshape([b, t, self.kv_heads, self.head_dim])
        v = self.v_proj(x).reshape([b, t, self.kv_heads, self.head_dim]).transpose([0, 2, 1, 3])
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose([0, 2, 1, 3]), k.transpose([0, 2, 1, 3])
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if self.kv_heads != self.heads:
            repeats = self.heads // self.kv_heads
            k = paddle.repeat_interleave(k, repeats, axis=1)
            v = paddle.repeat_interleave(v, repeats, axis=1)
        out = _causal_attention(q, k, v, self.head_dim**-0.5)
        return self.o_proj(out.transpose([0, 2, 1, 3]).reshape([b, t, self.heads * self.head_dim]))


class GatedMLP(nn.Layer):
    def __init__(self, spec: HfSpec):
        super().__init__()
        h, inner = spec.hidden_size, spec.intermediate_size
        self.gate_proj = _linear(h, inner, spec.mlp_bias)
        self.up_proj = _linear(h, inner, spec.mlp_bias)
        self.down_proj = _linear(inner, h, spec.mlp_bias)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Layer):
    def __init__(self, spec: HfSpec):
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.self_attn = Attention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.mlp = GatedMLP(spec)

    def forward(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Layer):
    def __init__(self, spec: HfSpec):
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.LayerList([DecoderLayer(spec) for _ in range(spec.num_layers)])
        self.norm = RMSNorm(spec.hidden_size, spec.norm_eps)


class _CausalLM(nn.Layer):
    """A family's backbone under its transformers name, and its head: the embedding's transpose
    where config.json ties them, else lm_head."""

    def __init__(self, spec: HfSpec, name: str, backbone: nn.Layer):
        super().__init__()
        self.hf_spec = spec
        setattr(self, name, backbone)  # before the head: the parameters in transformers' order
        if not spec.tied:
            self.lm_head = _linear(spec.hidden_size, spec.vocab_size, False)

    def _logits(self, x: paddle.Tensor, embedding: nn.Embedding) -> paddle.Tensor:
        if self.hf_spec.tied:
            return paddle.matmul(x, embedding.weight, transpose_y=True)
        return self.lm_head(x)


class DecoderForCausalLM(_CausalLM):
    """LLaMA, Mistral, Qwen2 and Qwen3: the names of transformers' *ForCausalLM."""

    def __init__(self, spec: HfSpec):
        super().__init__(spec, "model", DecoderModel(spec))

    def forward(self, ids: paddle.Tensor) -> paddle.Tensor:
        spec = self.hf_spec
        cos, sin = (paddle.to_tensor(a) for a in _rope(ids.shape[1], spec.head_dim, spec.rope_theta))
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self._logits(self.model.norm(x), self.model.embed_tokens)


class GPT2Attention(nn.Layer):
    def __init__(self, spec: HfSpec):
        super().__init__()
        h = spec.hidden_size
        self.heads, self.head_dim = spec.num_heads, spec.head_dim
        self.c_attn = nn.Linear(h, 3 * h)  # Conv1D's [in, out] weight is Paddle's Linear layout
        self.c_proj = nn.Linear(h, h)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        b, t, h = x.shape
        qkv = self.c_attn(x).reshape([b, t, 3, self.heads, self.head_dim]).transpose([2, 0, 3, 1, 4])
        out = _causal_attention(qkv[0], qkv[1], qkv[2], 1.0 / math.sqrt(self.head_dim))
        return self.c_proj(out.transpose([0, 2, 1, 3]).reshape([b, t, h]))


class GPT2MLP(nn.Layer):
    def __init__(self, spec: HfSpec):
        super().__init__()
        self.c_fc = nn.Linear(spec.hidden_size, spec.intermediate_size)
        self.c_proj = nn.Linear(spec.intermediate_size, spec.hidden_size)
        self.tanh = spec.activation == "tanh"

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate=self.tanh))


class GPT2Block(nn.Layer):
    def __init__(self, spec: HfSpec):
        super().__init__()
        self.ln_1 = nn.LayerNorm(spec.hidden_size, epsilon=spec.norm_eps)
        self.attn = GPT2Attention(spec)
        self.ln_2 = nn.LayerNorm(spec.hidden_size, epsilon=spec.norm_eps)
        self.mlp = GPT2MLP(spec)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Layer):
    def __init__(self, spec: HfSpec):
        super().__init__()
        self.wte = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.wpe = nn.Embedding(spec.max_positions, spec.hidden_size)
        self.h = nn.LayerList([GPT2Block(spec) for _ in range(spec.num_layers)])
        self.ln_f = nn.LayerNorm(spec.hidden_size, epsilon=spec.norm_eps)


class GPT2LMHeadModel(_CausalLM):
    def __init__(self, spec: HfSpec):
        super().__init__(spec, "transformer", GPT2Model(spec))

    def forward(self, ids: paddle.Tensor) -> paddle.Tensor:
        positions = paddle.arange(ids.shape[1], dtype="int64")
        x = self.transformer.wte(ids) + self.transformer.wpe(positions)
        for block in self.transformer.h:
            x = block(x)
        return self._logits(self.transformer.ln_f(x), self.transformer.wte)


def build_hf(spec: HfSpec, weights: Dict[str, np.ndarray]) -> nn.Layer:
    model = GPT2LMHeadModel(spec) if spec.family == "gpt2" else DecoderForCausalLM(spec)
    params = dict(model.named_parameters())
    wanted = expected_shapes(spec)
    if set(params) != set(wanted) or set(weights) != set(wanted):
        odd = sorted(set(params) ^ set(wanted)) or sorted(set(weights) ^ set(wanted))
        raise ConfigError("model.path", spec.path, f"weights that unitrain's Paddle {spec.family} takes ({odd[0]})")
    transposed = set(linear_names(spec))
    for name, param in params.items():
        array = weights[name].T if name in transposed else weights[name]
        param.set_value(np.ascontiguousarray(array, dtype=np.float32))
    model.train()
    return model


def hf_state(model: nn.Layer) -> Dict[str, np.ndarray]:
    transposed = set(linear_names(model.hf_spec))
    return {
        name: (value.numpy().T if name in transposed else value.numpy()).copy()
        for name, value in model.named_parameters()
    }


def hf_linear_weights(model: nn.Layer) -> List[str]:
    return [f"{name}.weight" for name, m in model.named_sublayers() if isinstance(m, nn.Linear)]
