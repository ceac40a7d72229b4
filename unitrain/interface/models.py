"""Networks built from the shared specs: what ``backends/<name>/models.py`` provides.

Both backends build each spec with the same layer names, so that parameter names line up one to
one across frameworks (:mod:`unitrain.model.weights` converts the few layouts that differ).
"""

from __future__ import annotations

from typing import Any, List, Protocol, cast

from unitrain.interface import modules
from unitrain.spec.models import GPTSpec, ResNetSpec, ViTSpec


class ModelsModule(Protocol):
    def build_resnet(self, spec: ResNetSpec, num_classes: int, zero_init_residual: bool) -> Any:
        """The framework's ResNet for ``spec``, initialised by the framework's own RNG."""

    def build_vit(self, spec: ViTSpec, num_classes: int) -> Any:
        """The framework's Vision Transformer for ``spec``, initialised by the framework's own RNG."""

    def build_gpt(self, spec: GPTSpec, vocab_size: int) -> Any:
        """The framework's GPT for ``spec``: int64 token ids [batch, time <= block_size] in, float32
        logits [batch, time, vocab_size] out; initialised by the framework's own RNG."""

    def is_model(self, obj: Any) -> bool:
        """Whether ``obj`` is the framework's model type (what a user's factory must return)."""

    def buffer_names(self, model: Any) -> List[str]:
        """The state names of ``model``'s buffers (an index, a mask: values it computes, never
        drawn). Paddle keeps BatchNorm's running statistics as parameters, torch as buffers."""

    def linear_weights(self, model: Any) -> List[str]:
        """The state names of ``model``'s Linear weights (the framework's own layer type): the
        2-D weights whose layout differs between frameworks, unlike an embedding's."""


def models_module(backend: str) -> ModelsModule:
    return cast(ModelsModule, modules.load(backend, "models"))
