"""The optimizers in torch: momentum SGD (Nesterov optional), plain SGD and Adam with L2 weight
decay, AdamW with decoupled weight decay; global-norm clipping optional (docs/optimizers.md)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Set

import torch

from unitrain.config.schema import OptimConfig
from unitrain.interface.optim import decays, rule_of
from unitrain.spec.optimizers import COLLECTIVE, implemented

__all__ = ["build_optimizer", "nonfinite_state", "set_lr"]


def _embedding_tables(model: torch.nn.Module) -> Set[str]:
    """The names of nn.Embedding weights, as named_parameters names them (a table tied to a
    Linear's weight is found by identity, under whichever name it is listed)."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return {n for n, p in model.named_parameters() if id(p) in tables}


def _groups(model: torch.nn.Module, cfg: OptimConfig) -> List[Dict[str, Any]]:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if cfg.decay_norm_and_bias:
        return [{"params": [p for _, p in named]}]
    tables = _embedding_tables(model)
    return [
        {"params": [p for n, p in named if decays(n, p.shape, tables)]},
        {"params": [p for n, p in named if not decays(n, p.shape, tables)], "weight_decay": 0.0},
    ]


def _momentum(groups, cfg: OptimConfig) -> torch.optim.Optimizer:
    # weight_decay * param is added to the gradient before momentum: the same L2 update as
    # paddle.optimizer.Momentum with L2Decay.
    return torch.optim.SGD(
        groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.nesterov
    )


def _sgd(groups, cfg: OptimConfig) -> torch.optim.Optimizer:
    # Plain SGD whatever optim.momentum says (validation refuses a momentum with it).
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=0.0, weight_decay=cfg.weight_decay)


def _adam(groups, cfg: OptimConfig) -> torch.optim.Optimizer:
    # L2: weight_decay * param added to the (clipped) gradient before the moments, as Paddle's
    # L2Decay regularizer does after its grad_clip.
    return torch.optim.Adam(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)


def _adamw(groups, cfg: OptimConfig) -> torch.optim.Optimizer:
    # Decoupled: param *= 1 - lr * weight_decay, then the Adam step; Paddle's AdamW kernel
    # computes param - lr * coeff * param and adds the Adam step to it, the same update.
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay
    )


_RULES: Mapping[str, Callable[[List[Dict[str, Any]], OptimConfig], torch.optim.Optimizer]] = implemented(
    COLLECTIVE, {"momentum": _momentum, "sgd": _sgd, "adam": _adam, "adamw": _adamw}
)


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    optimizer = rule_of(_RULES, cfg.name)(_groups(model, cfg), cfg)
    if cfg.clip_grad_norm is not None:
        # Before every step, as paddle's grad_clip does inside its optimizer (and before its L2
        # regularizer, as torch adds weight decay inside step()): GradScaler.step unscales the
        # gradients before calling step(), so the norm is the true one, and a step the scaler
        # skips is not clipped at all.
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
