"""The wide&deep click-through model's shared pieces: how both engines start it."""

from __future__ import annotations

import math
from typing import List, Tuple

import numpy as np

from unitrain.data.criteo import DENSE_FEATURES, SPARSE_SLOTS

#: Embedding rows start uniform in +-EMBED_INIT on both frameworks (Paddle's servers draw a row
#: when it is first pulled, so only the scheme, not the draws, can be shared).
EMBED_INIT = 0.01


def tower_init(cfg) -> List[Tuple[np.ndarray, np.ndarray]]:
    """The dense part's initial weights, drawn once in NumPy so that both frameworks start from
    the same ones: each deep layer, the output layer, then the wide part's linear term on the
    dense features. Weights are [in, out] (Paddle's layout; torch transposes), drawn as
    torch.nn.Linear draws them, U(-1/sqrt(in), 1/sqrt(in))."""
    rng = np.random.default_rng((cfg.trainer.seed, 3))  # stream 3: not the data's or the ResNets'
    widths = [DENSE_FEATURES + SPARSE_SLOTS * cfg.model.embedding_dim, *cfg.model.hidden_layers, 1]
    layers = [(widths[i], widths[i + 1]) for i in range(len(widths) - 1)] + [(DENSE_FEATURES, 1)]
    out = []
    for fan_in, fan_out in layers:
        bound = 1.0 / math.sqrt(fan_in)
        out.append(
            (
                rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32),
                rng.uniform(-bound, bound, fan_out).astype(np.float32),
            )
        )
    return out
