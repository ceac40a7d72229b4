"""The built-in GPTs: one spec, the same parameter names on both frameworks, causal, the head tied
to the token embedding, and the same logits and gradients from the same shared weights."""

from __future__ import annotations

import math
from typing import Dict

import numpy as np
import pytest

from conftest import BACKENDS
from unitrain.interface.backend import get_backend
from unitrain.interface.models import models_module
from unitrain.model.build import build_model
from unitrain.model.pairing import table
from unitrain.spec.initial_weights import gpt_init
from unitrain.spec.models import MODELS, GPTSpec, is_language_model

VOCAB = 65  # shakespeare_char's
SPEC = MODELS.get("gpt_nano")


def _tensor(backend: str, array: np.ndarray):
    if backend == "torch":
        import torch

        return torch.from_numpy(array)
    import paddle

    return paddle.to_tensor(array)


def _logits(backend: str, model, tokens: np.ndarray) -> np.ndarray:
    return get_backend(backend).to_numpy(model(_tensor(backend, tokens)))


def _canonical(backend: str, model, arrays: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """``arrays`` (in the framework's names and layouts) in the canonical layout: Linear weights
    [out, in], embeddings as they are."""
    shapes = {name: tuple(a.shape) for name, a in arrays.items()}
    params = table(backend, shapes, models_module(backend).linear_weights(model))
    return {p.canonical: arrays[p.name].T if p.transposed else arrays[p.name] for p in params}


def _tokens(batch: int, time: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, time), dtype=np.int64)


@pytest.fixture(scope="module")
def shared():
    """Both frameworks' gpt_nano from the same shared weights, in evaluation mode."""
    models = {b: build_model(get_backend(b), "gpt_nano", VOCAB, init="shared", seed=5) for b in BACKENDS}
    for model in models.values():
        model.eval()
    return models


def test_both_frameworks_build_the_same_gpt_and_compute_the_same_logits(shared):
    states = {b: _canonical(b, m, get_backend(b).state_arrays(m)) for b, m in shared.items()}
    assert list(states["torch"]) == list(states["paddle"])  # the same names, in the same order
    assert all(np.array_equal(states["torch"][k], states["paddle"][k]) for k in states["torch"])
    assert states["paddle"]["wte.weight"].shape == (VOCAB, SPEC.dim)  # not taken for a Linear
    tokens = _tokens(4, SPEC.block_size)
    got, want = _logits("paddle", shared["paddle"], tokens), _logits("torch", shared["torch"], tokens)
    assert got.shape == want.shape == (4, SPEC.block_size, VOCAB) and got.dtype == np.float32
    assert np.abs(got - want).max() < 1e-5 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_token_changes_no_logit_before_it(shared, backend):
    tokens, t = _tokens(2, SPEC.block_size), 11
    changed = tokens.copy()
    changed[:, t] = (changed[:, t] + 1) % VOCAB
    before, after = _logits(backend, shared[backend], tokens), _logits(backend, shared[backend], changed)
    np.testing.assert_allclose(after[:, :t], before[:, :t], rtol=0, atol=1e-6)
    assert np.abs(after[:, t:] - before[:, t:]).max(axis=(0, 2)).min() > 1e-6  # it does change t and after


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_head_is_the_token_embedding(shared, backend):
    model = shared[backend]
    names = list(get_backend(backend).state_arrays(model))
    assert get_backend(backend).num_parameters(model) == SPEC.num_parameters(VOCAB)
    assert not any("head" in name for name in names) and names[:2] == ["wte.weight", "wpe.weight"]
    assert "wte.weight" not in models_module(backend).linear_weights(model)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sequence_shorter_than_the_context_is_its_prefix(shared, backend):
    tokens = _tokens(3, SPEC.block_size, seed=1)
    full = _logits(backend, shared[backend], tokens)
    for time in (1, 7):
        short = _logits(backend, shared[backend], tokens[:, :time])
        assert short.shape == (3, time, VOCAB)
        np.testing.assert_allclose(short, full[:, :time], rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_framework_init_is_nanogpts(backend):
    model = build_model(get_backend(backend), "gpt_nano", VOCAB, seed=0)
    state = _canonical(backend, model, get_backend(backend).state_arrays(model))
    assert abs(state["wte.weight"].std() - 0.02) < 0.002 and abs(state["wte.weight"].mean()) < 0.002
    assert abs(state["blocks.0.attn.qkv.weight"].std() - 0.02) < 0.002
    residual = 0.02 / math.sqrt(2 * SPEC.depth)
    assert abs(state["blocks.1.mlp.fc2.weight"].std() - residual) < 0.1 * residual
    assert not state["blocks.0.attn.proj.bias"].any() and (state["norm.weight"] == 1).all()


def test_shared_init_draws_nanogpts_scheme_the_same_from_the_same_seed():
    spec = MODELS.get("gpt_mini")
    shapes = {"wte.weight": (VOCAB, 128), "blocks.3.attn.proj.weight": (128, 128), "blocks.3.attn.proj.bias": (128,)}
    shapes["norm.weight"] = (128,)
    a, b = gpt_init(shapes, spec, seed=1), gpt_init(dict(reversed(shapes.items())), spec, seed=1)
    assert all(np.array_equal(a[k], b[k]) for k in shapes)  # the state's order does not matter
    assert abs(a["wte.weight"].std() - 0.02) < 0.002
    assert abs(a["blocks.3.attn.proj.weight"].std() - 0.02 / math.sqrt(8)) < 0.0007
    assert not a["blocks.3.attn.proj.bias"].any() and (a["norm.weight"] == 1).all()
    assert not np.array_equal(a["wte.weight"], gpt_init(shapes, spec, seed=2)["wte.weight"])


def _gradients(backend: str, model, tokens: np.ndarray, targets: np.ndarray) -> Dict[str, np.ndarray]:
    """Each parameter's gradient of the mean cross-entropy over every position."""
    logits = model(_tensor(backend, tokens))
    if backend == "torch":
        import torch.nn.functional as F

        F.cross_entropy(logits.reshape(-1, VOCAB), _tensor(backend, targets).reshape(-1)).backward()
    else:
        import paddle.nn.functional as F

        F.cross_entropy(logits.reshape([-1, VOCAB]), _tensor(backend, targets).reshape([-1])).backward()
    grads = {name: get_backend(backend).to_numpy(p.grad) for name, p in model.named_parameters()}
    return _canonical(backend, model, grads)


def test_one_steps_gradients_agree_between_frameworks():
    models = {b: build_model(get_backend(b), "gpt_nano", VOCAB, init="shared", seed=7) for b in BACKENDS}
    sequence = _tokens(4, SPEC.block_size + 1, seed=2)
    tokens, targets = sequence[:, :-1], sequence[:, 1:]  # next-token prediction
    grads = {b: _gradients(b, m, tokens, targets) for b, m in models.items()}
    assert list(grads["torch"]) == list(grads["paddle"])
    for name, want in grads["torch"].items():
        diff = np.abs(grads["paddle"][name] - want).max()
        assert diff <= 1e-4 * max(1e-3, np.abs(want).max()), (name, diff, np.abs(want).max())
    assert np.abs(grads["torch"]["wte.weight"]).max() > 0  # the tied head's gradient reaches it


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_dropout_reaches_the_gpt_in_training_only(backend):
    model = build_model(get_backend(backend), "gpt_nano", VOCAB, init="shared", seed=0, dropout=0.5)
    tokens = _tokens(2, 8)
    model.train()
    assert not np.array_equal(_logits(backend, model, tokens), _logits(backend, model, tokens))
    model.eval()
    np.testing.assert_array_equal(_logits(backend, model, tokens), _logits(backend, model, tokens))


def test_language_models_are_told_apart_by_name():
    assert is_language_model("gpt_nano") and is_language_model("gpt_mini")
    assert not is_language_model("vit_tiny") and not is_language_model("custom")
    assert MODELS.get("gpt_mini") == GPTSpec(dim=128, depth=4, heads=4, block_size=64)
