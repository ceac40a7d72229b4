"""torch's attention on Paddle, for translated code (:mod:`unitrain.backends.paddle.translate`).

Paddle's torch-compatible attention (``paddle.compat.nn.MultiheadAttention`` and
``paddle.compat.nn.functional.scaled_dot_product_attention``) reads ``shape.numel()``, which a
legacy program's shapes (tuples) lack: Paddle's int8 path traces into such a program. These keep
the compat layer's parameters and compute torch's attention in matmul, softmax, reshape and
transpose there. No paddle import at module level: the translate module loads without it.
"""

from __future__ import annotations

from unitrain.errors import UnitrainError

__all__ = ["multihead_attention_layer", "scaled_dot_product_attention"]


class _WrittenOut:
    """torch's multi-head attention in operators every tracer takes (matmul, softmax, reshape,
    transpose), on the compat layer's parameters: what :func:`multihead_attention_layer`'s class
    runs in a legacy program. Mixed into that class, which is defined on first use."""

    def written_out(self, query, key, value, need_weights=True, average_attn_weights=True):
        """The attention in operators every tracer takes (no mask, packed projections)."""
        import paddle
        from paddle.nn import functional as F

        if not self.batch_first:  # heads are split on [batch, seq, embed]
            query, key, value = (t.transpose([1, 0, 2]) for t in (query, key, value))
        if query is key and key is value:
            q, k, v = paddle.split(self._in_proj(query), 3, axis=-1)
        else:
            q, k, v = (self._in_proj(t, i) for i, t in enumerate((query, key, value)))
        # 0 keeps that dimension: the batch (and lengths) stay dynamic in a traced program.
        q, k, v = (t.reshape([0, 0, self.num_heads, self.head_dim]).transpose([0, 2, 1, 3]) for t in (q, k, v))
        weights = F.softmax(paddle.matmul(q * self.head_dim**-0.5, k, transpose_y=True), axis=-1)
        if self.training and self.dropout > 0:
            weights = F.dropout(weights, self.dropout)
        out = paddle.matmul(weights, v).transpose([0, 2, 1, 3]).reshape([0, 0, self.embed_dim])
        out = self.out_proj(out)
        if not self.batch_first:
            out = out.transpose([1, 0, 2])
        if not need_weights:
            return out, None
        return out, weights.mean(axis=1) if average_attn_weights else weights

    def _in_proj(self, x, part=None):
        """x projected by torch's packed in_proj_weight: by all of it (q, k and v in one
        matmul, as torch does for self-attention) or by its ``part``-th third."""
        import paddle

        w, b = self.in_proj_weight, self.in_proj_bias
        if part is not None:
            rows = slice(part * self.embed_dim, (part + 1) * self.embed_dim)
            w, b = w[rows], None if b is None else b[rows]
        out = paddle.matmul(x, w, transpose_y=True)
        return out if b is None else out + b


def multihead_attention_layer():
    """The bridge class, defined on first use (this module loads without paddle)."""
    import paddle

    class MultiheadAttention(_WrittenOut, paddle.compat.nn.MultiheadAttention):
        """torch's nn.MultiheadAttention on Paddle's torch-compatible layer (its parameters, names
        and layouts). In dygraph and PIR programs the compat layer computes it (its fused
        attention: training and exports as PaConvert wrote them); in a legacy program (Paddle's
        int8 path), where its scaled_dot_product_attention reads ``shape.numel()`` of a tuple,
        :meth:`written_out` does, in matmul, softmax, reshape and transpose (``paddle.matmul`` and
        the compat out_proj trace there through quantize.legacy_operators). Masks, causal
        attention, separate projection weights, bias_kv, zero_attn and unbatched inputs always
        go to the compat layer."""

        def forward(
            self,
            query,
            key,
            value,
            key_padding_mask=None,
            need_weights=True,
            attn_mask=None,
            average_attn_weights=True,
            is_causal=False,
        ):
            masked = attn_mask is not None or key_padding_mask is not None or is_causal
            plain = self._qkv_same_embed_dim and self.bias_k is None and not self.add_zero_attn and query.ndim == 3
            legacy = not (paddle.in_dynamic_mode() or paddle.framework.in_pir_mode())
            if masked or not plain or not legacy:
                return super().forward(
                    query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal
                )
            return self.written_out(query, key, value, need_weights, average_attn_weights)

    return MultiheadAttention


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """torch's F.scaled_dot_product_attention: Paddle's compat function in dygraph and PIR; in a
    legacy program (Paddle's int8 path), whose shapes are tuples its ``shape.numel()`` cannot
    read, written out in matmul and softmax, a causal mask a constant of the traced sizes."""
    import paddle

    if paddle.in_dynamic_mode() or paddle.framework.in_pir_mode():
        compat = paddle.compat.nn.functional.scaled_dot_product_attention
        return compat(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return _written_out_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)


def _written_out_attention(query, key, value, attn_mask, dropout_p, is_causal, scale):
    import numpy as np
    import paddle
    from paddle.nn import functional as F

    rows, cols, depth = query.shape[-2], key.shape[-2], query.shape[-1]
    scores = paddle.matmul(query, key, transpose_y=True) * (scale or depth**-0.5)
    if is_causal:
        if rows < 0 or cols < 0:
            raise UnitrainError(
                "causal attention over a length known only when it runs cannot be traced into Paddle's int8 "
                "program; allowed: inputs of a fixed length (the exported batch's)"
            )
        scores = scores + paddle.assign(np.triu(np.full((rows, cols), -np.inf, np.float32), 1))
    if attn_mask is not None and attn_mask.dtype == paddle.bool:
        scores = paddle.where(attn_mask, scores, paddle.full_like(scores, -np.inf))
    elif attn_mask is not None:
        scores = scores + attn_mask
    weights = F.softmax(scores, axis=-1)
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p)
    return paddle.matmul(weights, value)
