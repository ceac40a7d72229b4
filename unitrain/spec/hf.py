"""A Hugging Face model folder (``model=hf model.path=DIR``), framework-free: its config.json read
into an :class:`HfSpec` (the families LLaMA, Mistral without sliding windows, Qwen2, Qwen3 and
GPT-2) and the parameter names and shapes the spec implies (its weights: spec/hf_weights.py;
its text job: tasks/hf_text.py). Everything a folder holds that would change the numbers and that unitrain
does not implement is refused in one line (a ConfigError on ``model.path``), before anything
is written: validation reads the config and the weight files' headers only.

Both halves take the checkpoint's own parameter names (``model.layers.0.self_attn.q_proj.weight``,
``transformer.h.0.attn.c_attn.weight``); the torch half is transformers' class, the Paddle half
unitrain's (``backends/paddle/hf.py``), whose Linear weights are [in, out]: :func:`linear_names`
names the weights whose layout differs (GPT-2's Conv1D weights are [in, out] already).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple

from unitrain.errors import ConfigError

#: model.name of a Hugging Face folder.
HF = "hf"
#: config.json's model_type -> the family unitrain builds it as.
FAMILIES: Dict[str, str] = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gpt2": "gpt2"}
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
#: GPT-2's activations unitrain writes: transformers' names -> exact or tanh GELU.
GPT2_ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "exact"}
#: safetensors' dtypes read into float32 (BF16 by its raw bits: NumPy has no bfloat16).
FLOAT_DTYPES = ("F32", "F16", "F64", "BF16")
_KEY = "model.path"


@dataclass(frozen=True)
class HfSpec:
    """What unitrain builds from a config.json: the same numbers in both frameworks."""

    path: str
    model_type: str
    family: str  # llama (llama, mistral), qwen2, qwen3, gpt2
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_positions: int
    norm_eps: float
    tied: bool
    rope_theta: float = 10000.0
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    activation: str = "silu"  # silu (gated MLP), or GPT-2's: tanh / exact GELU

    @property
    def folder(self) -> Path:
        return Path(self.path)


def refusal(path: Any, why: str) -> ConfigError:
    return ConfigError(_KEY, str(path), why)


def _get(config: Mapping[str, Any], path: Any, key: str, kind: type = int) -> Any:
    value = config.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, (kind, int) if kind is float else kind):
        raise refusal(path, f"a config.json with {key} ({kind.__name__}); it has {value!r}")
    return kind(value)


def _rope_theta(config: Mapping[str, Any], path: Any) -> float:
    """rope_theta, from transformers 5's rope_parameters or the older top-level keys; any scaling
    but the default refused (it changes the numbers and is not implemented)."""
    params = config.get("rope_parameters")
    scaling = config.get("rope_scaling")
    if isinstance(params, Mapping):
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            raise refusal(
                path, f"rope_parameters.rope_type default (unitrain implements no rope scaling); it is {kind}"
            )
        theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    elif params is not None:
        raise refusal(path, f"rope_parameters as a mapping; it is {params!r}")
    else:
        theta = config.get("rope_theta", 10000.0)
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, Mapping) else scaling
        if kind != "default":
            raise refusal(
                path, f"no rope_scaling (unitrain implements none; it changes the numbers); it has {scaling!r}"
            )
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise refusal(path, f"partial_rotary_factor 1 (not implemented); it is {config['partial_rotary_factor']}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise refusal(path, f"a positive rope_theta; it is {theta!r}")
    return float(theta)


def _no_sliding_window(config: Mapping[str, Any], path: Any, model_type: str) -> None:
    if model_type == "mistral":
        if config.get("sliding_window") is not None:
            raise refusal(
                path,
                f"mistral without a sliding window (sliding_window null; not implemented); it has "
                f"sliding_window {config['sliding_window']}",
            )
        return
    if config.get("use_sliding_window"):
        raise refusal(path, f"{model_type} with use_sliding_window false (sliding windows are not implemented)")
    kinds = set(config.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        raise refusal(
            path, f"layer_types all full_attention (sliding windows are not implemented); it has {sorted(kinds)}"
        )


def _decoder_spec(config: Mapping[str, Any], path: Any, model_type: str) -> HfSpec:
    family = FAMILIES[model_type]
    hidden = _get(config, path, "hidden_size")
    heads = _get(config, path, "num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    if config.get("hidden_act", "silu") != "silu":
        raise refusal(path, f"hidden_act silu ({model_type}'s gated MLP); it is {config['hidden_act']}")
    if heads % kv_heads:
        raise refusal(path, f"num_attention_heads ({heads}) a multiple of num_key_value_heads ({kv_heads})")
    if config.get("pretraining_tp", 1) != 1:
        raise refusal(path, f"pretraining_tp 1 (not implemented); it is {config['pretraining_tp']}")
    _no_sliding_window(config, path, model_type)
    bias = bool(config.get("attention_bias", False))
    return HfSpec(
        path=str(path),
        model_type=model_type,
        family=family,
        vocab_size=_get(config, path, "vocab_size"),
        hidden_size=hidden,
        num_layers=_get(config, path, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=_get(config, path, "intermediate_size"),
        max_positions=int(config.get("max_position_embeddings") or 2048),
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        tied=bool(config.get("tie_word_embeddings", False)),
        rope_theta=_rope_theta(config, path),
        # Qwen2's q/k/v always have biases, its o_proj none; LLaMA's and Qwen3's follow attention_bias.
        qkv_bias=True if family == "qwen2" else bias,
        o_bias=False if family == "qwen2" else bias,
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=family == "qwen3",
    )


def _gpt2_spec(config: Mapping[str, Any], path: Any) -> HfSpec:
    act = config.get("activation_function", "gelu_new")
    if act not in GPT2_ACTIVATIONS:
        raise refusal(path, f"activation_function one of {', '.join(GPT2_ACTIVATIONS)}; it is {act}")
    for key, default in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if config.get(key, default) != default:
            raise refusal(path, f"{key} {str(default).lower()} (the other is not implemented)")
    if config.get("reorder_and_upcast_attn") or config.get("add_cross_attention"):
        raise refusal(path, "GPT-2 without reorder_and_upcast_attn or add_cross_attention (not implemented)")
    hidden = _get(config, path, "n_embd")
    heads = _get(config, path, "n_head")
    return HfSpec(
        path=str(path),
        model_type="gpt2",
        family="gpt2",
        vocab_size=_get(config, path, "vocab_size"),
        hidden_size=hidden,
        num_layers=_get(config, path, "n_layer"),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=int(config.get("n_inner") or 4 * hidden),
        max_positions=_get(config, path, "n_positions"),
        norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
        tied=bool(config.get("tie_word_embeddings", True)),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        activation=GPT2_ACTIVATIONS[act],
    )


def read_config(path: Any) -> HfSpec:
    """The spec of the folder ``path`` (its config.json), or one line saying what is wrong."""
    if path is None or str(path) in ("", "None"):
        raise refusal(path, "a local Hugging Face model folder (config.json, model.safetensors) with model=hf")
    folder = Path(str(path))
    file = folder / CONFIG_FILE
    if not folder.is_dir():
        raise refusal(path, "a local Hugging Face model folder (it does not exist; unitrain never downloads)")
    if not file.is_file():
        raise refusal(path, f"a Hugging Face model folder holding {CONFIG_FILE} (it has none)")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise refusal(path, f"a readable JSON {CONFIG_FILE} ({err})") from None
    if not isinstance(config, dict):
        raise refusal(path, f"a {CONFIG_FILE} holding an object")
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise refusal(
            path,
            f"a checkpoint of the families unitrain builds on both frameworks: model_type {', '.join(FAMILIES)} "
            f"(LLaMA, Mistral without sliding windows, Qwen2, Qwen3, GPT-2); it is {model_type!r}",
        )
    spec = _gpt2_spec(config, folder) if model_type == "gpt2" else _decoder_spec(config, folder, model_type)
    if spec.hidden_size <= 0 or spec.num_heads <= 0 or spec.num_layers <= 0 or spec.vocab_size <= 0:
        raise refusal(path, "a config.json with positive sizes")
    return spec


def expected_shapes(spec: HfSpec) -> Dict[str, Tuple[int, ...]]:
    """The parameters a checkpoint of ``spec`` holds, by its own names (torch's layouts: Linear
    [out, in], GPT-2's Conv1D [in, out]); a tied head is not among them."""
    h, layers = spec.hidden_size, spec.num_layers
    shapes: Dict[str, Tuple[int, ...]] = {}
    if spec.family == "gpt2":
        inner = spec.intermediate_size
        shapes["transformer.wte.weight"] = (spec.vocab_size, h)
        shapes["transformer.wpe.weight"] = (spec.max_positions, h)
        for i in range(layers):
            p = f"transformer.h.{i}."
            for norm in ("ln_1", "ln_2"):
                shapes[p + norm + ".weight"] = shapes[p + norm + ".bias"] = (h,)
            shapes[p + "attn.c_attn.weight"], shapes[p + "attn.c_attn.bias"] = (h, 3 * h), (3 * h,)
            shapes[p + "attn.c_proj.weight"], shapes[p + "attn.c_proj.bias"] = (h, h), (h,)
            shapes[p + "mlp.c_fc.weight"], shapes[p + "mlp.c_fc.bias"] = (h, inner), (inner,)
            shapes[p + "mlp.c_proj.weight"], shapes[p + "mlp.c_proj.bias"] = (inner, h), (h,)
        shapes["transformer.ln_f.weight"] = shapes["transformer.ln_f.bias"] = (h,)
        if not spec.tied:
            shapes["lm_head.weight"] = (spec.vocab_size, h)
        return shapes
    q, kv, inner = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.intermediate_size
    shapes["model.embed_tokens.weight"] = (spec.vocab_size, h)
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = shapes[p + "post_attention_layernorm.weight"] = (h,)
        for name, out in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            shapes[p + f"self_attn.{name}.weight"] = (out, h)
            if spec.qkv_bias:
                shapes[p + f"self_attn.{name}.bias"] = (out,)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        if spec.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if spec.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = shapes[p + "self_attn.k_norm.weight"] = (spec.head_dim,)
        for name, shape in (("gate_proj", (inner, h)), ("up_proj", (inner, h)), ("down_proj", (h, inner))):
            shapes[p + f"mlp.{name}.weight"] = shape
            if spec.mlp_bias:
                shapes[p + f"mlp.{name}.bias"] = (shape[0],)
    shapes["model.norm.weight"] = (h,)
    if not spec.tied:
        shapes["lm_head.weight"] = (spec.vocab_size, h)
    return shapes


def linear_names(spec: HfSpec) -> List[str]:
    """The checkpoint's weights stored as torch's Linear ([out, in]): the Paddle half's Linear
    holds them transposed. GPT-2's Conv1D weights are [in, out], Paddle's layout: none."""
    if spec.family == "gpt2":
        return ["lm_head.weight"] if not spec.tied else []
    return [n for n, s in expected_shapes(spec).items() if len(s) == 2 and n != "model.embed_tokens.weight"]
