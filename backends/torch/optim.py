"""The seed's optimizer in torch: momentum SGD with L2 weight decay (Nesterov, clipping optional)."""

from __future__ import annotations

from typing import Optional

import torch

from unitrain.config.schema import OptimConfig
from unitrain.interface.optim import decays

__all__ = ["build_optimizer", "nonfinite_state", "set_lr"]


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    # torch adds weight_decay * param to the gradient before momentum: the same L2 update as
    # paddle.optimizer.Momentum with L2Decay, so both frameworks follow one update rule.
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if cfg.decay_norm_and_bias:
        groups = [{"params": [p for _, p in named]}]
    else:
        groups = [
            {"params": [p for n, p in named if decays(n, p.shape)]},
            {"params": [p for n, p in named if not decays(n, p.shape)], "weight_decay": 0.0},
        ]
    optimizer = torch.optim.SGD(
        groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.nesterov
    )
    if cfg.clip_grad_norm is not None:
        # Before every step, as paddle's grad_clip does inside its optimizer: GradScaler.step
        # unscales the gradients before calling step(), so the norm is the true one, and a
        # step the scaler skips is not clipped at all.
        max_norm = cfg.clip_grad_norm

        def clip(opt, args, kwargs) -> None:
            torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], max_norm)

        optimizer.register_step_pre_hook(clip)
    return optimizer


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def nonfinite_state(optimizer: torch.optim.Optimizer) -> Optional[str]:
    names = {
        id(p): f"group{g}.param{i}"
        for g, group in enumerate(optimizer.param_groups)
        for i, p in enumerate(group["params"])
    }
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if torch.is_tensor(value) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                return f"{names.get(id(param), 'a parameter')}'s {key}"
    return None
