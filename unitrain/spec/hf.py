"""A Hugging Face model folder (``model=hf model.path=DIR``), framework-free: its config.json read
into an :class:`HfSpec` (the families LLaMA, Mistral without sliding windows, Qwen2, Qwen3 and
GPT-2), the parameter names and shapes the spec implies, and its safetensors weights read as
float32 NumPy arrays. Everything a folder holds that would change the numbers and that unitrain
does not implement is refused in one line (a ConfigError on ``model.path``), before anything
is written: validation reads the config and the weight files' headers only.

Both halves take the checkpoint's own parameter names (``model.layers.0.self_attn.q_proj.weight``,
``transformer.h.0.attn.c_attn.weight``); the torch half is transformers' class, the Paddle half
unitrain's (``backends/paddle/hf.py``), whose Linear weights are [in, out]: :func:`linear_names`
names the weights whose layout differs (GPT-2's Conv1D weights are [in, out] already).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

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
_FLOAT_DTYPES = ("F32", "F16", "F64", "BF16")
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


def _fail(path: Any, why: str) -> ConfigError:
    return ConfigError(_KEY, str(path), why)


def _get(config: Mapping[str, Any], path: Any, key: str, kind: type = int) -> Any:
    value = config.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, (kind, int) if kind is float else kind):
        raise _fail(path, f"a config.json with {key} ({kind.__name__}); it has {value!r}")
    return kind(value)


def _rope_theta(config: Mapping[str, Any], path: Any) -> float:
    """rope_theta, from transformers 5's rope_parameters or the older top-level keys; any scaling
    but the default refused (it changes the numbers and is not implemented)."""
    params = config.get("rope_parameters")
    scaling = config.get("rope_scaling")
    if isinstance(params, Mapping):
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            raise _fail(path, f"rope_parameters.rope_type default (unitrain implements no rope scaling); it is {kind}")
        theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    elif params is not None:
        raise _fail(path, f"rope_parameters as a mapping; it is {params!r}")
    else:
        theta = config.get("rope_theta", 10000.0)
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, Mapping) else scaling
        if kind != "default":
            raise _fail(path, f"no rope_scaling (unitrain implements none; it changes the numbers); it has {scaling!r}")
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise _fail(path, f"partial_rotary_factor 1 (not implemented); it is {config['partial_rotary_factor']}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise _fail(path, f"a positive rope_theta; it is {theta!r}")
    return float(theta)


def _no_sliding_window(config: Mapping[str, Any], path: Any, model_type: str) -> None:
    if model_type == "mistral":
        if config.get("sliding_window") is not None:
            raise _fail(
                path,
                f"mistral without a sliding window (sliding_window null; not implemented); it has "
                f"sliding_window {config['sliding_window']}",
            )
        return
    if config.get("use_sliding_window"):
        raise _fail(path, f"{model_type} with use_sliding_window false (sliding windows are not implemented)")
    kinds = set(config.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        raise _fail(
            path, f"layer_types all full_attention (sliding windows are not implemented); it has {sorted(kinds)}"
        )


def _decoder_spec(config: Mapping[str, Any], path: Any, model_type: str) -> HfSpec:
    family = FAMILIES[model_type]
    hidden = _get(config, path, "hidden_size")
    heads = _get(config, path, "num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    if config.get("hidden_act", "silu") != "silu":
        raise _fail(path, f"hidden_act silu ({model_type}'s gated MLP); it is {config['hidden_act']}")
    if heads % kv_heads:
        raise _fail(path, f"num_attention_heads ({heads}) a multiple of num_key_value_heads ({kv_heads})")
    if config.get("pretraining_tp", 1) != 1:
        raise _fail(path, f"pretraining_tp 1 (not implemented); it is {config['pretraining_tp']}")
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
        raise _fail(path, f"activation_function one of {', '.join(GPT2_ACTIVATIONS)}; it is {act}")
    for key, default in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if config.get(key, default) != default:
            raise _fail(path, f"{key} {str(default).lower()} (the other is not implemented)")
    if config.get("reorder_and_upcast_attn") or config.get("add_cross_attention"):
        raise _fail(path, "GPT-2 without reorder_and_upcast_attn or add_cross_attention (not implemented)")
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
        raise _fail(path, "a local Hugging Face model folder (config.json, model.safetensors) with model=hf")
    folder = Path(str(path))
    file = folder / CONFIG_FILE
    if not folder.is_dir():
        raise _fail(path, "a local Hugging Face model folder (it does not exist; unitrain never downloads)")
    if not file.is_file():
        raise _fail(path, f"a Hugging Face model folder holding {CONFIG_FILE} (it has none)")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise _fail(path, f"a readable JSON {CONFIG_FILE} ({err})") from None
    if not isinstance(config, dict):
        raise _fail(path, f"a {CONFIG_FILE} holding an object")
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise _fail(
            path,
            f"a checkpoint of the families unitrain builds on both frameworks: model_type {', '.join(FAMILIES)} "
            f"(LLaMA, Mistral without sliding windows, Qwen2, Qwen3, GPT-2); it is {model_type!r}",
        )
    spec = _gpt2_spec(config, folder) if model_type == "gpt2" else _decoder_spec(config, folder, model_type)
    if spec.hidden_size <= 0 or spec.num_heads <= 0 or spec.num_layers <= 0 or spec.vocab_size <= 0:
        raise _fail(path, "a config.json with positive sizes")
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


def weight_files(folder: Path) -> List[Path]:
    """model.safetensors, or the shards model.safetensors.index.json names; one line for a
    folder with pickled weights only (pytorch_model.bin: never unpickled) or none."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise _fail(folder, f"a readable {INDEX_FILE} with a weight_map ({err})") from None
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise _fail(folder, f"every shard {INDEX_FILE} names; {missing[0]} is missing")
        return [folder / s for s in shards]
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    pickled = sorted(p.name for p in folder.glob("pytorch_model*.bin"))
    if pickled:
        raise _fail(
            folder,
            f"weights in safetensors (model.safetensors or {INDEX_FILE}); it has {pickled[0]}, a pickle, which "
            "unitrain does not read (pickles run code): convert it once with transformers' save_pretrained",
        )
    raise _fail(folder, f"a Hugging Face model folder with its weights ({WEIGHTS_FILE} or {INDEX_FILE}); it has none")


def _header(file: Path) -> Tuple[Dict[str, Any], int]:
    """A safetensors file's header (name -> dtype, shape, data_offsets) and where its data starts."""
    try:
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > 100_000_000:
                raise ValueError("header too large")
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error) as err:
        raise _fail(file.parent, f"safetensors files that read; {file.name} does not ({err})") from None
    header.pop("__metadata__", None)
    return header, 8 + size


def _headers(spec: HfSpec) -> Dict[str, Tuple[Path, Dict[str, Any], int]]:
    found: Dict[str, Tuple[Path, Dict[str, Any], int]] = {}
    for file in weight_files(spec.folder):
        header, start = _header(file)
        for name, entry in header.items():
            found[name] = (file, entry, start)
    return found


def _checked_headers(spec: HfSpec) -> Dict[str, Tuple[Path, Dict[str, Any], int]]:
    """The weight files' entries, checked against the names and shapes ``spec`` implies."""
    found = _headers(spec)
    expected = expected_shapes(spec)
    if spec.tied:
        # A tied head is often saved too (transformers drops it, others keep it): it must equal the embedding's shape.
        found.pop("lm_head.weight", None)
    missing = [n for n in expected if n not in found]
    if missing:
        raise _fail(
            spec.path,
            f"weights matching its config.json: {missing[0]} is missing ({len(missing)} missing in all)",
        )
    extra = [n for n in found if n not in expected and not _ignorable(n)]
    if extra:
        raise _fail(spec.path, f"weights matching its config.json: {extra[0]} is not a parameter of {spec.model_type}")
    for name, shape in expected.items():
        file, entry, _ = found[name]
        if tuple(entry.get("shape", ())) != shape:
            raise _fail(
                spec.path, f"weights matching its config.json: {name} is {tuple(entry.get('shape', ()))}, not {shape}"
            )
        if entry.get("dtype") not in _FLOAT_DTYPES:
            raise _fail(spec.path, f"float weights (F32, F16, BF16); {name} is {entry.get('dtype')}")
    return {n: found[n] for n in expected}


def _ignorable(name: str) -> bool:
    # Buffers some writers saved: rotary tables, GPT-2's causal masks.
    return name.endswith((".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias"))


def check_folder(path: Any) -> HfSpec:
    """What validation checks (config.json and the weight files' headers; no weights read)."""
    spec = read_config(path)
    _checked_headers(spec)
    return spec


def read_weights(spec: HfSpec) -> Dict[str, np.ndarray]:
    """The checkpoint's parameters as float32 arrays by its names (``expected_shapes``), through
    ``safetensors``' NumPy reader (no torch): F32 as is, F16 and F64 converted. NumPy has no
    bfloat16, so a BF16 tensor is read as its raw bytes at the offsets the file's header gives and
    widened by its bits (bfloat16 is float32's upper half: the 16 bits shifted left, exact)."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise _fail(
            spec.path, "readable once the safetensors package is installed (pip install 'unitrain[hf]')"
        ) from None
    entries = _checked_headers(spec)
    arrays: Dict[str, np.ndarray] = {}
    by_file: Dict[Path, List[str]] = {}
    for name, (file, _entry, _) in entries.items():
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        with safe_open(str(file), framework="numpy") as f:
            for name in names:
                _, entry, start = entries[name]
                if entry["dtype"] == "BF16":
                    begin, end = entry["data_offsets"]
                    bits = np.fromfile(file, dtype="<u2", count=(end - begin) // 2, offset=start + begin)
                    array = (bits.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])
                else:
                    array = f.get_tensor(name)
                arrays[name] = np.ascontiguousarray(array, dtype=np.float32)
    return arrays


def tokenizer_file(spec: HfSpec) -> Optional[Path]:
    """The folder's tokenizer.json, None without one."""
    file = spec.folder / TOKENIZER_FILE
    return file if file.is_file() else None


#: data=text's keys that the checkpoint's tokenizer decides: set beside model=hf, refused.
_TOKENIZER_KEYS = (("tokenizer", "char"), ("vocab_size", 1024))


def check_job(cfg: Any) -> HfSpec:
    """model=hf's rules, from the config and the folder's config.json and file headers (no weights
    read): the folder (:func:`check_folder`), its tokenizer.json (its vocabulary within the
    embedding table), model.init=shared refused (the weights are the checkpoint's), the tokenizer
    keys unset, data.block_size within the model's positions."""
    spec = check_folder(cfg.model.path)
    if str(cfg.model.init) == "shared":
        raise ConfigError(
            "model.init", "shared", "framework (the default) with model=hf: the weights are the checkpoint's"
        )
    for key, default in _TOKENIZER_KEYS:
        value = getattr(cfg.data, key, default)
        if str(value) != str(default):
            raise ConfigError(
                f"data.{key}", value, "unset with model=hf (the tokens are the checkpoint's tokenizer.json's)"
            )
    tokenizer = text_tokenizer(spec)
    block = getattr(cfg.data, "block_size", None)
    if block is None:
        raise ConfigError(
            "data.block_size",
            None,
            f"the tokens per sample with model=hf (at most {spec.max_positions}, its positions)",
        )
    if block > spec.max_positions:
        raise ConfigError("data.block_size", block, f"at most {spec.max_positions}, the checkpoint's positions")
    if tokenizer.vocab_size > spec.vocab_size:
        raise _fail(
            spec.path,
            f"a tokenizer.json whose vocabulary fits the embedding table: it has {tokenizer.vocab_size} tokens, "
            f"config.json's vocab_size is {spec.vocab_size}",
        )
    return spec


def text_tokenizer(spec: HfSpec) -> Any:
    """The folder's tokenizer.json, read by the ``tokenizers`` library (one line without one)."""
    from unitrain.data.text import load_tokenizer

    file = tokenizer_file(spec)
    if file is None:
        raise _fail(spec.path, f"a Hugging Face model folder with its {TOKENIZER_FILE} (data=text's tokens)")
    return load_tokenizer(file)


class _TextData:
    """data=text's config as the checkpoint's tokenizer reads it: byte-level BPE of its size."""

    def __init__(self, data: Any, vocab_size: int):
        self._data, self.tokenizer, self.vocab_size = data, "bpe", vocab_size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._data, name)


def text_data(cfg: Any) -> Tuple[Any, Path, int]:
    """What ``load_text`` takes for a model=hf job: the data config as its tokenizer reads it,
    the folder's tokenizer.json (``tokenizer_file=``), and the model's positions
    (``max_block_size=``)."""
    spec = read_config(cfg.model.path)
    tokenizer = text_tokenizer(spec)
    return _TextData(cfg.data, tokenizer.vocab_size), tokenizer_file(spec), spec.max_positions
