"""The wide&deep static program every process of a Paddle parameter-server job builds: its inputs,
the two embedding tables (on the servers, a trainer's own copy, or plain lookups that geo's
evaluation turns into the servers'), the deep tower and the wide part from the shared NumPy
weights, the loss and the click probability; and a batch as the program's feed."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np
import paddle

from unitrain.data.criteo import DENSE_FEATURES, SPARSE_SLOTS, CtrData
from unitrain.spec.ps_model import EMBED_INIT, tower_init

#: Where the embedding tables live: on the servers (sparse_embedding), a copy of the trainer's
#: own (geo, and one process without servers), or plain lookups (geo's evaluation, which points
#: them at the servers).
TABLES_ON = ("servers", "trainer", "lookup")


def wide_deep(cfg, tables: str) -> Tuple[Any, Any, Dict[str, np.ndarray]]:
    """The loss, the click probability, and the dense parameters' shared initial values (by
    parameter name), built into the default programs; ``tables``: one of TABLES_ON."""
    static = paddle.static
    dense = static.data("dense", [-1, DENSE_FEATURES], "float32")
    # The batch's 26 ids per row, row after row; a sequence (lod_level 1) where Fleet's dataset
    # reader fills it, which gives each row's 26 ids as one slot.
    engine_fed = cfg.dist.ps.feed == "engine" and tables != "lookup"
    ids = static.data("ids", [-1, 1], "int64", lod_level=1 if engine_fed else 0)
    label = static.data("label", [-1, 1], "float32")
    deep, wide = _embeddings(cfg, ids, tables)
    logit, initial = _towers(cfg, dense, deep, wide)
    loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(logit, label))
    return loss, paddle.nn.functional.sigmoid(logit), initial


def _embeddings(cfg, ids, tables: str):
    """The deep part's embeddings of a row's ids, side by side, and the wide part's sum of them."""
    static, dim = paddle.static, cfg.model.embedding_dim

    def table(name: str, width: int):
        attr = paddle.ParamAttr(name=name, initializer=paddle.nn.initializer.Uniform(-EMBED_INIT, EMBED_INIT))
        # Geo trains a local copy of the table, which sparse_embedding's server-only table
        # cannot give (init_worker fails on it): geo takes embedding(is_sparse=True).
        if tables == "lookup":
            return static.nn.embedding(ids, size=[cfg.model.sparse_buckets, width], param_attr=attr)
        if tables == "servers":
            return static.nn.sparse_embedding(ids, size=[cfg.model.sparse_buckets, width], param_attr=attr)
        return static.nn.embedding(ids, size=[cfg.model.sparse_buckets, width], is_sparse=True, param_attr=attr)

    deep = paddle.reshape(table("deep_table", dim), [-1, SPARSE_SLOTS * dim])
    wide = paddle.sum(paddle.reshape(table("wide_table", 1), [-1, SPARSE_SLOTS]), axis=1, keepdim=True)
    return deep, wide


def _towers(cfg, dense, deep, wide):
    """The logit: the deep tower over dense features and embeddings, plus the wide part; and the
    dense parameters' shared values, which replace their initializers after the startup program."""
    static = paddle.static
    *layers, wide_dense = tower_init(cfg)
    initial: Dict[str, np.ndarray] = {}

    def attr(name: str, value: np.ndarray) -> paddle.ParamAttr:
        # A plain initializer in the program: the servers' dense tables build their own from
        # it and crash on Assign's. The shared values replace it before init_worker pushes them.
        initial[name] = value
        return paddle.ParamAttr(name=name, initializer=paddle.nn.initializer.Constant(0.0))

    x = paddle.concat([dense, deep], axis=1)
    for i, (weight, bias) in enumerate(layers):
        last = i == len(layers) - 1
        x = static.nn.fc(
            x,
            weight.shape[1],
            weight_attr=attr(f"deep_{i}.w", weight),
            bias_attr=attr(f"deep_{i}.b", bias),
            activation=None if last else "relu",
        )
    wide_part = static.nn.fc(
        dense, 1, weight_attr=attr("wide_dense.w", wide_dense[0]), bias_attr=attr("wide_dense.b", wide_dense[1])
    )
    return x + wide_part + wide, initial


def feed(batch: CtrData, with_label: bool = True) -> Dict[str, np.ndarray]:
    out = {"dense": batch.dense, "ids": batch.sparse.reshape(-1, 1)}
    if with_label:
        out["label"] = batch.label.reshape(-1, 1)
    return out
