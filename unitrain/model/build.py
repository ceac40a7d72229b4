"""Models built by a backend: the shared specs (ResNets, ViTs, GPTs) or a user's pair, optionally
from the same NumPy initial weights on every framework (``model.init=shared``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import numpy as np

from unitrain.interface.backend import Backend, Native
from unitrain.interface.hf import hf_module
from unitrain.interface.models import models_module
from unitrain.model.custom import CustomModel, sized
from unitrain.model.pairing import shared_initial_state, table
from unitrain.model.weights import from_canonical, to_canonical
from unitrain.spec.hf import HfSpec
from unitrain.spec.hf_weights import read_weights
from unitrain.spec.initial_weights import gpt_init, shared_init
from unitrain.spec.models import MODELS, GPTSpec, ResNetSpec, ViTSpec


def build_model(
    backend: Backend,
    model: str | ResNetSpec | ViTSpec | GPTSpec | CustomModel | HfSpec,
    num_classes: int,
    *,
    image_size: Optional[int] = None,
    device: Optional[str] = None,
    zero_init_residual: bool = True,
    init: str = "framework",
    seed: int = 0,
    dropout: Optional[float] = None,
) -> Native:
    """``backend``'s network for a built-in model's name or spec
    (:data:`unitrain.spec.models.MODELS`) or a user's pair, on ``device``.

    ``image_size`` sizes a ViT named by its name for those images (its patch grid);
    ``init="shared"`` loads weights drawn in NumPy from ``seed``: the same on every framework.
    A GPT's vocabulary is ``num_classes`` tokens; ``dropout`` (model.dropout) replaces its spec's,
    and is ignored by the other models. An :class:`~unitrain.spec.hf.HfSpec` (model=hf) is built
    with its checkpoint's weights: ``init``, ``num_classes`` and ``dropout`` do not apply (its
    vocabulary is its config.json's; validation refuses model.init=shared).
    """
    if isinstance(model, HfSpec):
        net = hf_module(backend.name).build_hf(model, read_weights(model))
    else:
        if isinstance(model, str) and image_size:
            model = sized(model, image_size)
        spec: Any = MODELS.get(model) if isinstance(model, str) else model
        if isinstance(spec, GPTSpec) and dropout is not None:
            spec = replace(spec, dropout=dropout)
        net = _built(backend, spec, num_classes, zero_init_residual, seed if init == "shared" else None)
    # Both frameworks' layers have .to(device) returning the layer itself.
    # Built on the CPU already: Paddle's LSTM and GRU hold a dropout state that is never
    # initialised, and Layer.to() fails on it.
    return net.to(device) if device and device != "cpu" else net


def _built(
    backend: Backend, spec: Any, num_classes: int, zero_init_residual: bool, shared_seed: Optional[int]
) -> Native:
    """A spec's (or a user's pair's) network, with the weights drawn from ``shared_seed`` in
    NumPy where it is given (model.init=shared)."""
    shared = shared_seed is not None
    if isinstance(spec, ResNetSpec):
        net = models_module(backend.name).build_resnet(spec, num_classes, zero_init_residual)
        if shared:
            _load_shared_resnet(backend, net, spec, shared_seed, zero_init_residual)
    elif isinstance(spec, GPTSpec):
        net = models_module(backend.name).build_gpt(spec, num_classes)
        if shared:
            _load_shared_gpt(backend, net, spec, shared_seed)
    else:
        if isinstance(spec, ViTSpec):
            net = models_module(backend.name).build_vit(spec, num_classes)
        else:
            net = spec.build(backend.name, num_classes)
        if shared:
            models = models_module(backend.name)
            state, linear, buffers = backend.state_arrays(net), models.linear_weights(net), models.buffer_names(net)
            backend.load_state_arrays(net, shared_initial_state(backend.name, state, linear, shared_seed, buffers))
    return net


def _load_shared_resnet(backend: Backend, net: Native, spec: ResNetSpec, seed: int, zero_init_residual: bool) -> None:
    canonical = to_canonical(backend.name, backend.state_arrays(net))
    shapes = {name: tuple(array.shape) for name, array in canonical.items()}
    initial = shared_init(shapes, spec, seed, zero_init_residual)
    backend.load_state_arrays(net, from_canonical(backend.name, initial))


def _load_shared_gpt(backend: Backend, net: Native, spec: GPTSpec, seed: int) -> None:
    # The layouts through the model's own Linear weights: the embeddings are 2-D weights too, and
    # stay [rows, dim] on both frameworks.
    shapes = {name: tuple(array.shape) for name, array in backend.state_arrays(net).items()}
    params = table(backend.name, shapes, models_module(backend.name).linear_weights(net))
    initial = gpt_init({p.canonical: p.shape for p in params}, spec, seed)
    arrays = {p.name: initial[p.canonical].T if p.transposed else initial[p.canonical] for p in params}
    backend.load_state_arrays(net, {name: np.ascontiguousarray(array) for name, array in arrays.items()})
