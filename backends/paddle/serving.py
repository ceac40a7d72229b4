"""The served wide&deep model in Paddle: read from a Paddle parameter-server checkpoint (a
one-process job's ``paddle.static.save``, or Fleet's servers' saved tables), written with
``paddle.jit.save`` and through paddle2onnx, read back by a Paddle Inference predictor."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import paddle

from unitrain.backends.paddle.export import onnx_from_program
from unitrain.data.criteo import DENSE_FEATURES, SPARSE_SLOTS
from unitrain.errors import UnitrainError
from unitrain.spec.optimizers import state_values
from unitrain.spec.serving import Serving

__all__ = ["READERS", "WRITERS", "load_native", "read_checkpoint", "save"]

WRITERS = {"native": "paddle.jit.save", "onnx": "paddle2onnx"}
READERS = {"native": "paddle.inference predictor", "onnx": "onnxruntime"}
#: Written beside Fleet's tables by the trainer that saved them (backends/paddle/ps.py).
TABLES, DENSE = "tables.json", "dense.npz"


def _tower(params: Dict[str, np.ndarray]) -> List[Tuple[np.ndarray, np.ndarray]]:
    deep = sorted(int(k.split("_")[1].split(".")[0]) for k in params if k.startswith("deep_") and k.endswith(".w"))
    layers = [(params[f"deep_{i}.w"], params[f"deep_{i}.b"]) for i in deep]
    return [*layers, (params["wide_dense.w"], params["wide_dense.b"])]


def _fleet_table(folder: Path, dim: int, rule: str) -> Tuple[np.ndarray, np.ndarray]:
    """A table Fleet's servers saved as text (CtrCommonAccessor's layout: id, unseen days, delta
    score, show, click, slot, then the embed value and its state, then the embedx values)."""
    ids, rows = [], []
    embedx = 6 + state_values(rule, 1)
    for part in sorted(folder.glob("part-*")):
        with gzip.open(part, "rt") if part.suffix == ".gz" else open(part) as f:
            for line in f:
                fields = line.split()
                ids.append(int(fields[0]))
                values = fields[1:]
                rows.append([float(values[5]), *map(float, values[embedx : embedx + dim - 1])])
    return np.asarray(ids, np.int64), np.asarray(rows, np.float32).reshape(-1, dim)


def read_checkpoint(folder: Path, config: Dict[str, Any]) -> Tuple[np.ndarray, np.ndarray, List]:
    dim, rule = config["model"]["embedding_dim"], config["optim"]["name"]
    if (folder / "model.pdparams").exists():  # one process: the whole program's state
        with open(folder / "model.pdparams", "rb") as f:
            params = pickle.load(f)
        rows = np.concatenate([params["deep_table"], params["wide_table"]], axis=1)
        return np.arange(len(rows), dtype=np.int64), rows, _tower(params)
    tables = json.loads((folder / TABLES).read_text())
    deep_ids, deep = _fleet_table(folder / f"{tables['deep_table']:03d}", dim, rule)
    wide_ids, wide = _fleet_table(folder / f"{tables['wide_table']:03d}", 1, rule)
    # Both tables hold the ids the trainers pulled: the same ids, in whatever order.
    order_deep, order_wide = np.argsort(deep_ids), np.argsort(wide_ids)
    if not np.array_equal(deep_ids[order_deep], wide_ids[order_wide]):
        raise UnitrainError(f"checkpoint {folder}: the deep and wide tables hold different ids")
    rows = np.concatenate([deep[order_deep], wide[order_wide]], axis=1)
    with np.load(folder / DENSE) as saved:
        params = {k: saved[k] for k in saved.files}
    return deep_ids[order_deep], rows, _tower(params)


class Served(paddle.nn.Layer):
    def __init__(self, serving: Serving):
        super().__init__()
        self.dim = serving.dim
        self.table = paddle.create_parameter(list(serving.rows.shape), "float32")
        self.table.set_value(serving.rows)
        *deep, (wide_w, wide_b) = serving.layers
        self.deep = paddle.nn.LayerList([_linear(w, b) for w, b in deep])
        self.wide = _linear(wide_w, wide_b)

    def forward(self, dense, rows):
        looked = paddle.gather(self.table, rows.reshape([-1])).reshape([-1, SPARSE_SLOTS, self.dim + 1])
        x = paddle.concat([dense, looked[:, :, : self.dim].reshape([-1, SPARSE_SLOTS * self.dim])], axis=1)
        for i, layer in enumerate(self.deep):
            x = layer(x)
            if i < len(self.deep) - 1:
                x = paddle.nn.functional.relu(x)
        return paddle.nn.functional.sigmoid(x[:, 0] + self.wide(dense)[:, 0] + looked[:, :, self.dim].sum(axis=1))


def _linear(weight: np.ndarray, bias: np.ndarray) -> paddle.nn.Linear:
    layer = paddle.nn.Linear(*weight.shape)
    layer.weight.set_value(weight)
    layer.bias.set_value(bias)
    return layer


def _spec():
    return [
        paddle.static.InputSpec([None, DENSE_FEATURES], "float32", "dense"),
        paddle.static.InputSpec([None, SPARSE_SLOTS], "int64", "rows"),
    ]


def _jit_save(serving: Serving, stem: Path) -> List[Path]:
    paddle.set_device("cpu")
    model = Served(serving)
    model.eval()
    paddle.jit.save(model, str(stem), input_spec=_spec())
    return [stem.with_name(stem.name + s) for s in (".json", ".pdiparams")]


def save(serving: Serving, stem: Path, fmt: str) -> List[Path]:
    if fmt == "native":
        return _jit_save(serving, stem)
    return onnx_from_program(lambda prefix: _jit_save(serving, prefix), stem)


def load_native(files: List[Path], threads: int):
    from paddle import inference

    config = inference.Config(str(files[0]), str(files[1]))
    config.disable_glog_info()
    config.set_cpu_math_library_num_threads(threads)
    predictor = inference.create_predictor(config)
    names = predictor.get_input_names()
    output = predictor.get_output_handle(predictor.get_output_names()[0])

    def predict(dense: np.ndarray, rows: np.ndarray) -> np.ndarray:
        for name, value in zip(names, (dense, rows)):
            handle = predictor.get_input_handle(name)
            handle.reshape(list(value.shape))
            handle.copy_from_cpu(np.ascontiguousarray(value))
        predictor.run()
        return output.copy_to_cpu().reshape(-1)

    return predict
