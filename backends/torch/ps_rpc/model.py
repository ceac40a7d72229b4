"""The wide&deep model of torch's parameter-server job: the dense tower from the shared NumPy
weights, its optimizer (the rule spec/optimizers.py names, torch's own), and the sparse table
(spec/ps_table.py's, both tables as one)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from unitrain.spec.optimizers import PS, implemented
from unitrain.spec.ps_model import EMBED_INIT, tower_init
from unitrain.spec.ps_table import SparseTable


class Tower(nn.Module):
    """The dense part: the deep tower over [dense features, embeddings] plus the wide part's
    linear term on the dense features, from the shared NumPy initial weights."""

    def __init__(self, cfg):
        super().__init__()
        *deep, wide = tower_init(cfg)
        self.deep = nn.ModuleList(_linear(w, b) for w, b in deep)
        self.wide_dense = _linear(*wide)

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor, wide_sparse: torch.Tensor) -> torch.Tensor:
        x = torch.cat([dense, embedded], dim=1)
        for i, layer in enumerate(self.deep):
            x = layer(x)
            if i < len(self.deep) - 1:
                x = F.relu(x)
        return (x + self.wide_dense(dense)).squeeze(1) + wide_sparse


def _linear(weight: np.ndarray, bias: np.ndarray) -> nn.Linear:
    layer = nn.Linear(*weight.shape)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight.T.copy()))
        layer.bias.copy_(torch.from_numpy(bias))
    return layer


#: The dense tower's optimizer for each of the servers' rules: torch's own of the same name.
_DENSE: Mapping[str, Callable[..., torch.optim.Optimizer]] = implemented(
    PS, {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}
)


def dense_optimizer(name: Any, params, lr: float) -> torch.optim.Optimizer:
    return _DENSE[str(name)](params, lr=lr)


def new_table(cfg) -> SparseTable:
    """Both tables as one (deep | wide): a row is ``embedding_dim + 1`` values."""
    return SparseTable(
        width=cfg.model.embedding_dim + 1,
        rule=cfg.optim.name,
        lr=cfg.optim.lr,
        seed=cfg.trainer.seed,
        init_scale=EMBED_INIT,
    )
