"""Initial weights drawn once in NumPy (``model.init=shared``), the same for every framework.

The scheme is the one both backends apply with their own RNGs (the ResNets: Kaiming-normal fan-out
convs, unit BatchNorm, the last BatchNorm of each residual branch zeroed, PyTorch's default uniform
Linear; the GPTs: nanoGPT's), so a shared run differs from a framework-initialised one only in the
random draws.
"""

from __future__ import annotations

import math
import re
from typing import Dict, Tuple

import numpy as np

from unitrain.spec.models import GPTSpec, ResNetSpec

Arrays = Dict[str, np.ndarray]


def shared_init(
    shapes: Dict[str, Tuple[int, ...]], spec: ResNetSpec, seed: int, zero_init_residual: bool = True
) -> Arrays:
    """Canonical (PyTorch-layout) arrays for a model whose canonical names and shapes are given."""
    rng = np.random.default_rng((seed, 2))  # stream 2: not the data's streams 0 and 1
    last_bn = "bn3" if spec.block == "bottleneck" else "bn2"
    out: Arrays = {}
    for name in sorted(shapes):  # a fixed order, so the draws do not depend on dict order
        shape = shapes[name]
        if name.endswith("num_batches_tracked"):
            out[name] = np.array(0, dtype=np.int64)
        elif len(shape) == 4:  # conv: Kaiming normal, fan-out, ReLU gain
            fan_out = shape[0] * shape[2] * shape[3]
            out[name] = rng.normal(0.0, math.sqrt(2.0 / fan_out), shape).astype(np.float32)
        elif name.startswith("fc."):  # Linear: U(-1/sqrt(in), 1/sqrt(in)), as torch.nn.Linear
            bound = 1.0 / math.sqrt(shapes["fc.weight"][1])
            out[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
        elif name.endswith(("running_mean", ".bias")):
            out[name] = np.zeros(shape, np.float32)
        elif name.endswith("running_var"):
            out[name] = np.ones(shape, np.float32)
        elif name.endswith(".weight"):  # BatchNorm scale
            zero = zero_init_residual and re.search(rf"layer\d+\.\d+\.{last_bn}\.weight$", name)
            out[name] = np.zeros(shape, np.float32) if zero else np.ones(shape, np.float32)
        else:
            raise ValueError(f"no initialiser for {name} {shape}")
    return out


def generic_init(shapes: Dict[str, Tuple[int, ...]], seed: int) -> Arrays:
    """Canonical arrays for any model (a user's pair), each parameter drawn from its own stream,
    numbered by its place in ``shapes`` (the model's order): the two halves of a pair register
    their layers in the same order even where they name them differently (a port line by line),
    so both start from the same weights. 2-D and larger: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as
    torch's default Linear and convolution (fan_in: all but the first dimension, Linear weights
    [out, in]); 1-D weights (normalisation scales) 1, biases and running means 0, running
    variances 1."""
    out: Arrays = {}
    for place, (name, shape) in enumerate(shapes.items()):
        rng = np.random.default_rng((seed, 2, place))
        if name.endswith("num_batches_tracked"):
            out[name] = np.array(0, dtype=np.int64)
        elif name.endswith("running_var"):
            out[name] = np.ones(shape, np.float32)
        elif name.endswith(("running_mean", ".bias")) or name == "bias":
            out[name] = np.zeros(shape, np.float32)
        elif len(shape) == 1:
            out[name] = np.ones(shape, np.float32)
        else:
            fan_in = max(1, math.prod(shape[1:]))
            bound = 1.0 / math.sqrt(fan_in)
            out[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    return out


def gpt_init(shapes: Dict[str, Tuple[int, ...]], spec: GPTSpec, seed: int) -> Arrays:
    """Canonical arrays for a GPT (the backends' names, Linear weights [out, in]), nanoGPT's
    scheme: embeddings and Linear weights N(0, 0.02), each block's attn.proj and mlp.fc2 weights
    N(0, 0.02 / sqrt(2 * depth)), biases 0, LayerNorm scales 1. Each parameter is drawn from its
    own stream, numbered by its place among the sorted names: one parameter's draws do not depend
    on any other's shape or on the state's order."""
    residual = re.compile(r"blocks\.\d+\.(attn\.proj|mlp\.fc2)\.weight$")
    out: Arrays = {}
    for place, name in enumerate(sorted(shapes)):
        shape = shapes[name]
        rng = np.random.default_rng((seed, 2, place))
        if name.endswith(".bias"):
            out[name] = np.zeros(shape, np.float32)
        elif len(shape) == 1 and name.endswith(".weight"):  # LayerNorm scale
            out[name] = np.ones(shape, np.float32)
        elif len(shape) == 2 and name.endswith(".weight"):  # embeddings and Linears
            std = 0.02 / math.sqrt(2 * spec.depth) if residual.search(name) else 0.02
            out[name] = rng.normal(0.0, std, shape).astype(np.float32)
        else:
            raise ValueError(f"no initialiser for {name} {shape}")
    return out
