"""The optimizers in paddle: Momentum (Nesterov optional), SGD and Adam with L2Decay, AdamW with
decoupled weight decay; global-norm clipping optional (docs/optimizers.md)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Set

import paddle

from unitrain.config.schema import OptimConfig
from unitrain.interface.optim import decays, rule_of
from unitrain.spec.optimizers import COLLECTIVE, implemented

__all__ = ["build_optimizer", "nonfinite_state", "set_lr"]

_FLOATS = (paddle.float16, paddle.bfloat16, paddle.float32, paddle.float64)


def _embedding_tables(model: paddle.nn.Layer) -> Set[str]:
    """The names of paddle.nn.Embedding weights, as named_parameters names them (a table tied to
    a Linear's weight is found by identity, under whichever name it is listed)."""
    tables = {id(m.weight) for m in model.sublayers(include_self=True) if isinstance(m, paddle.nn.Embedding)}
    return {n for n, p in model.named_parameters() if id(p) in tables}


def _undecayed(model: paddle.nn.Layer, cfg: OptimConfig) -> List[paddle.Tensor]:
    """The parameters ``optim.decay_norm_and_bias=false`` keeps from decay (none when true)."""
    if cfg.decay_norm_and_bias:
        return []
    tables = _embedding_tables(model)
    return [p for n, p in model.named_parameters() if not p.stop_gradient and not decays(n, p.shape, tables)]


def _l2(model: paddle.nn.Layer, cfg: OptimConfig) -> paddle.regularizer.L2Decay:
    # L2Decay adds weight_decay * param to the gradient after grad_clip (Optimizer.apply_gradients),
    # as torch's weight_decay does inside step(), after unitrain's clipping pre-hook. A parameter's
    # own regularizer overrides the optimizer's. Not parameter groups: paddle clips each group by
    # its own global norm, torch (and the definition) all together.
    for p in _undecayed(model, cfg):
        p.regularizer = paddle.regularizer.L2Decay(0.0)
    return paddle.regularizer.L2Decay(cfg.weight_decay)


def _momentum(model, params, clip, cfg: OptimConfig) -> paddle.optimizer.Optimizer:
    return paddle.optimizer.Momentum(
        learning_rate=cfg.lr,
        momentum=cfg.momentum,
        parameters=params,
        use_nesterov=cfg.nesterov,
        weight_decay=_l2(model, cfg),
        grad_clip=clip,
    )


def _sgd(model, params, clip, cfg: OptimConfig) -> paddle.optimizer.Optimizer:
    # Plain SGD whatever optim.momentum says (validation refuses a momentum with it).
    return paddle.optimizer.SGD(learning_rate=cfg.lr, parameters=params, weight_decay=_l2(model, cfg), grad_clip=clip)


def _adam_args(params, clip, cfg: OptimConfig) -> Dict[str, Any]:
    """What Adam and AdamW are both given: the rate, the moments' rates and epsilon, the
    parameters and the clipping."""
    return {
        "learning_rate": cfg.lr,
        "beta1": cfg.beta1,
        "beta2": cfg.beta2,
        "epsilon": cfg.eps,
        "parameters": params,
        "grad_clip": clip,
    }


def _adam(model, params, clip, cfg: OptimConfig) -> paddle.optimizer.Optimizer:
    # Paddle's CPU kernel takes lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t) and eps * sqrt(1 - beta2^t):
    # lr_t * m / (sqrt(v) + eps * sqrt(1 - beta2^t)) = lr * m_hat / (sqrt(v_hat) + eps), torch's update.
    return paddle.optimizer.Adam(**_adam_args(params, clip, cfg), weight_decay=_l2(model, cfg))


def _adamw(model, params, clip, cfg: OptimConfig) -> paddle.optimizer.Optimizer:
    # Decoupled: the kernel takes param - lr * coeff * param (the un-bias-corrected lr) and adds
    # the Adam step to it, torch.optim.AdamW's update. apply_decay_param_fun receives Paddle's
    # internal names (param.name: linear_0.w_0), not the structured ones. AdamW has no L2 of its
    # own (regularization is None), so no parameter gets a regularizer here.
    kept = {p.name for p in _undecayed(model, cfg)}
    return paddle.optimizer.AdamW(
        **_adam_args(params, clip, cfg),
        weight_decay=cfg.weight_decay,
        apply_decay_param_fun=(lambda name: name not in kept) if kept else None,
    )


_RULES: Mapping[str, Callable[..., paddle.optimizer.Optimizer]] = implemented(
    COLLECTIVE, {"momentum": _momentum, "sgd": _sgd, "adam": _adam, "adamw": _adamw}
)


def build_optimizer(model: paddle.nn.Layer, cfg: OptimConfig) -> paddle.optimizer.Optimizer:
    params = [p for p in model.parameters() if not p.stop_gradient]
    clip = paddle.nn.ClipGradByGlobalNorm(cfg.clip_grad_norm) if cfg.clip_grad_norm is not None else None
    return rule_of(_RULES, cfg.name)(model, params, clip, cfg)


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
