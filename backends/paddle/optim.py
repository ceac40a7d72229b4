"""The seed's optimizer in paddle: Momentum with L2Decay (Nesterov, clipping optional)."""

from __future__ import annotations

from typing import Optional

import paddle

from unitrain.config.schema import OptimConfig
from unitrain.interface.optim import decays

__all__ = ["build_optimizer", "nonfinite_state", "set_lr"]

_FLOATS = (paddle.float16, paddle.bfloat16, paddle.float32, paddle.float64)


def build_optimizer(model: paddle.nn.Layer, cfg: OptimConfig) -> paddle.optimizer.Momentum:
    # L2Decay adds weight_decay * param to the gradient before momentum: the same update as
    # torch.optim.SGD(weight_decay=...), so both frameworks follow one update rule.
    named = [(n, p) for n, p in model.named_parameters() if not p.stop_gradient]
    if not cfg.decay_norm_and_bias:
        # A parameter's own regularizer overrides the optimizer's. Not parameter groups: paddle
        # clips each group by its own global norm, torch (and the definition) all together.
        for n, p in named:
            if not decays(n, p.shape):
                p.regularizer = paddle.regularizer.L2Decay(0.0)
    parameters = [p for _, p in named]
    return paddle.optimizer.Momentum(
        learning_rate=cfg.lr,
        momentum=cfg.momentum,
        parameters=parameters,
        use_nesterov=cfg.nesterov,
        weight_decay=paddle.regularizer.L2Decay(cfg.weight_decay),
        grad_clip=paddle.nn.ClipGradByGlobalNorm(cfg.clip_grad_norm) if cfg.clip_grad_norm is not None else None,
    )


def set_lr(optimizer: paddle.optimizer.Optimizer, lr: float) -> None:
    optimizer.set_lr(lr)


def nonfinite_state(optimizer: paddle.optimizer.Optimizer) -> Optional[str]:
    # Accumulators (velocity...), master weights, the lr scheduler's numbers: every float tensor.
    def tensors(state, prefix=""):
        for key, value in state.items():
            if isinstance(value, dict):
                yield from tensors(value, f"{prefix}{key}.")
            elif isinstance(value, paddle.Tensor) and value.dtype in _FLOATS:
                yield f"{prefix}{key}", value

    for name, value in tensors(optimizer.state_dict()):
        if not bool(paddle.isfinite(value).all()):
            return name
    return None
