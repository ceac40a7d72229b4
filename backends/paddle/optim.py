"""The seed's optimizer in paddle: Momentum with L2Decay."""

from __future__ import annotations

import paddle

from unitrain.config import OptimConfig


def build_optimizer(model: paddle.nn.Layer, cfg: OptimConfig) -> paddle.optimizer.Momentum:
    # L2Decay adds weight_decay * param to the gradient before momentum: the same update as
    # torch.optim.SGD(weight_decay=...), so both frameworks follow one update rule.
    return paddle.optimizer.Momentum(
        learning_rate=cfg.lr,
        momentum=cfg.momentum,
        parameters=model.parameters(),
        weight_decay=paddle.regularizer.L2Decay(cfg.weight_decay),
    )


def set_lr(optimizer: paddle.optimizer.Optimizer, lr: float) -> None:
    optimizer.set_lr(lr)
