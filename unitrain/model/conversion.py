"""A checkpoint's weights converted for a model built by a backend: exactly for the built-in
models (:mod:`unitrain.model.weights`), parameter matching for a user's pair
(:mod:`unitrain.model.pairing`). No framework is imported here."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import numpy as np

from unitrain.interface.models import models_module
from unitrain.model.build import build_model
from unitrain.model.custom import CustomModel, from_record, sized
from unitrain.model.pairing import convert_pair, table, tied
from unitrain.model.weights import convert
from unitrain.spec.models import ViTSpec

Arrays = Dict[str, np.ndarray]


def checkpoint_model(meta: Mapping[str, Any], run_dir: Optional[Path] = None) -> "str | ViTSpec | CustomModel":
    """What :func:`unitrain.model.build.build_model` takes to build a checkpoint's model again;
    ``run_dir``: the run that wrote it (a translated half is built from the run's own copy)."""
    if meta.get("custom"):
        return from_record(meta["custom"], run_dir)
    return sized(meta["model"], int(meta.get("config", {}).get("data", {}).get("image_size", 32)))


def model_record(backend: Any, model: Any, ref: "str | CustomModel", num_classes: int) -> Dict[str, Any]:
    """What a checkpoint keeps beside its weights to convert them later without this framework:
    the Linear weights' names, the class count, and a user's pair's factories and the names its
    state gives a tensor already named (``tied``: alias -> name, unitrain.model.pairing)."""
    record: Dict[str, Any] = {"linear": models_module(backend.name).linear_weights(model), "num_classes": num_classes}
    if isinstance(ref, CustomModel):
        record["custom"] = ref.record()
        record["tied"] = tied(backend, model)
    return record


def pair_tables(
    source_framework: str, source: Arrays, source_linear, backend: Any, model: Any, source_tied: Any = None
):
    """The source state's and ``model``'s parameter tables, and the model's BatchNorm counters;
    ``source_tied``: the source's aliases (alias -> name) where known (a checkpoint's record)."""
    target_state = backend.state_arrays(model)
    target = table(
        backend.name,
        {k: tuple(v.shape) for k, v in target_state.items()},
        models_module(backend.name).linear_weights(model),
        tied(backend, model),
    )
    counters = [k for k in target_state if k not in {p.name for p in target}]
    shapes = {k: tuple(v.shape) for k, v in source.items()}
    return table(source_framework, shapes, source_linear, source_tied), target, counters


def weights_for(arrays: Arrays, meta: Mapping[str, Any], backend: Any, model: Any) -> Arrays:
    """``arrays``, written by ``meta['framework']``, as ``backend``'s ``model`` loads them."""
    if meta["framework"] == backend.name:
        return arrays
    if not meta.get("custom"):
        return convert(arrays, meta["framework"], backend.name)
    source, target, counters = pair_tables(
        meta["framework"], arrays, meta.get("linear", []), backend, model, meta.get("tied")
    )
    return convert_pair(arrays, source, target, from_record(meta["custom"]).explicit_mapping(), counters)


def converted(arrays: Arrays, meta: Mapping[str, Any], backend: Any, run_dir: Optional[Path] = None) -> Arrays:
    """A checkpoint's weights as ``backend``'s (``unitrain.convert``), building its model only
    where matching needs it (a user's pair); ``run_dir``: the run that wrote them."""
    if not meta.get("custom") or meta["framework"] == backend.name:
        return weights_for(arrays, meta, backend, None)
    model = build_model(backend, checkpoint_model(meta, run_dir), meta["num_classes"])
    return weights_for(arrays, meta, backend, model)
