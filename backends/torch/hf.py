"""model=hf on torch: transformers' own class for the checkpoint's config.json
(``AutoModelForCausalLM``'s choice), holding the checkpoint's weights, its forward returning the
logits tensor (transformers returns an output object) so that the loop sees
[batch, time, vocab_size] as from every other language model. Dropout is off (its probabilities
set to 0: the Paddle half has none, and a job compares the two step by step); no cache."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
import torch
from torch import nn

from unitrain.errors import ConfigError
from unitrain.spec.hf import HfSpec, expected_shapes

__all__ = ["build_hf", "hf_linear_weights", "hf_state"]

#: The config keys of dropout probabilities in the supported families, set to 0.
_DROPOUTS = ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "summary_first_dropout")
_CLASSES: Dict[type, type] = {}


def _logits_forward(self: Any, input_ids: torch.Tensor) -> torch.Tensor:
    return super(type(self), self).forward(input_ids=input_ids, use_cache=False).logits


def _logits_class(base: type) -> type:
    """``base`` (transformers' class) whose forward returns the logits tensor; one per class."""
    if base not in _CLASSES:
        _CLASSES[base] = type(base.__name__, (base,), {"forward": _logits_forward, "__module__": __name__})
    return _CLASSES[base]


def _config(spec: HfSpec) -> Tuple[Any, type]:
    try:
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    except ImportError:
        raise ConfigError(
            "model", "hf", "runnable once transformers is installed (pip install 'unitrain[hf]')"
        ) from None
    config = AutoConfig.from_pretrained(spec.path, local_files_only=True)
    for key in _DROPOUTS:
        if hasattr(config, key):
            setattr(config, key, 0.0)
    config.use_cache = False
    return config, MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]


def build_hf(spec: HfSpec, weights: Dict[str, np.ndarray]) -> nn.Module:
    config, base = _config(spec)
    config._attn_implementation = "sdpa"
    model = _logits_class(base)(config)
    state = {name: torch.from_numpy(np.ascontiguousarray(array)) for name, array in weights.items()}
    result = model.load_state_dict(state, strict=False)
    wanted = set(expected_shapes(spec))
    missing = [n for n in result.missing_keys if n in wanted]
    if missing or result.unexpected_keys:
        first = (missing or result.unexpected_keys)[0]
        raise ConfigError("model.path", spec.path, f"weights that transformers' {base.__name__} takes ({first})")
    if spec.tied:
        model.tie_weights()
    return model.float().train()


def hf_state(model: nn.Module) -> Dict[str, np.ndarray]:
    tied = getattr(model.config, "tie_word_embeddings", False)
    return {
        name: value.detach().cpu().numpy().copy()
        for name, value in model.state_dict().items()
        if not (tied and name == "lm_head.weight")
    }


def hf_linear_weights(model: nn.Module) -> List[str]:
    return [f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Linear)]
