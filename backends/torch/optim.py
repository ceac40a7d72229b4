"""The seed's optimizer in torch: momentum SGD with L2 weight decay."""

from __future__ import annotations

import torch

from unitrain.config import OptimConfig


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    # torch adds weight_decay * param to the gradient before momentum: the same L2 update as
    # paddle.optimizer.Momentum with L2Decay, so both frameworks follow one update rule.
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
