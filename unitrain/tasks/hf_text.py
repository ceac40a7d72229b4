"""A Hugging Face checkpoint's text job (model=hf with data=text): the folder's tokenizer.json
decides the tokens (data.tokenizer and data.vocab_size left unset), its vocabulary fits the
embedding table, data.block_size fits its positions, and the corpus is read as that tokenizer
reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Tuple

from unitrain.data.text import load_tokenizer
from unitrain.errors import ConfigError
from unitrain.spec.hf import TOKENIZER_FILE, HfSpec, read_config, refusal
from unitrain.spec.hf_weights import check_folder


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
        raise refusal(
            spec.path,
            f"a tokenizer.json whose vocabulary fits the embedding table: it has {tokenizer.vocab_size} tokens, "
            f"config.json's vocab_size is {spec.vocab_size}",
        )
    return spec


def text_tokenizer(spec: HfSpec) -> Any:
    """The folder's tokenizer.json, read by the ``tokenizers`` library (one line without one)."""
    file = tokenizer_file(spec)
    if file is None:
        raise refusal(spec.path, f"a Hugging Face model folder with its {TOKENIZER_FILE} (data=text's tokens)")
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
