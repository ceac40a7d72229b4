"""What data=text reads of the config, and its checks of the config alone (preflight: no file is
opened)."""

from __future__ import annotations

from typing import Any, Optional, Protocol

from unitrain.data.text.tokenizer import BYTE_ALPHABET, KINDS, MAX_VOCAB, MIN_BPE_VOCAB, SPECIAL_TOKENS
from unitrain.errors import ConfigError


class DataConfig(Protocol):
    """What data=text reads of unitrain.config.schema.DataConfig (or of its DictConfig): config/
    sits above data/, so data/ names the fields it reads here instead of importing the dataclass."""

    path: Optional[str]
    tokenizer: Any
    vocab_size: int
    block_size: Optional[int]
    val_fraction: float


def check_text_config(cfg: DataConfig, max_block_size: Optional[int] = None) -> None:
    """data=text's keys, read from the config alone (no file is opened): one ConfigError each."""
    if not cfg.path:
        raise ConfigError("data.path", cfg.path, "a UTF-8 text file, or a folder of *.txt files (read in name order)")
    if str(cfg.tokenizer) not in KINDS:
        raise ConfigError("data.tokenizer", cfg.tokenizer, f"one of {', '.join(KINDS)}")
    # data.tokenizer=char ignores vocab_size: its vocabulary is the corpus's characters.
    if str(cfg.tokenizer) == "bpe" and not MIN_BPE_VOCAB <= cfg.vocab_size <= MAX_VOCAB:
        raise ConfigError(
            "data.vocab_size",
            cfg.vocab_size,
            f"at least {MIN_BPE_VOCAB} (the {BYTE_ALPHABET} bytes byte-level BPE starts from"
            f"{' + special tokens' if SPECIAL_TOKENS else ''}) and at most 2**32 with data.tokenizer=bpe",
        )
    if cfg.block_size is not None:
        _check_block_size(cfg.block_size, max_block_size)
    fraction = cfg.val_fraction
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 0.5):
        raise ConfigError(
            "data.val_fraction", fraction, "a fraction in (0, 0.5]: the share of the corpus, at its end, held out"
        )


def _check_block_size(block: int, max_block_size: Optional[int]) -> None:
    if block < 1:
        raise ConfigError("data.block_size", block, "an integer > 0: the tokens of one sample")
    if max_block_size is not None and block > max_block_size:
        raise ConfigError("data.block_size", block, f"at most {max_block_size}, the model's context length")


def resolve_block_size(cfg: DataConfig, block_size: Optional[int], max_block_size: Optional[int] = None) -> int:
    """data.block_size, else ``block_size`` (the model's context length), checked."""
    block = cfg.block_size if cfg.block_size is not None else block_size
    if block is None:
        raise ConfigError("data.block_size", None, "the tokens per sample (an integer > 0): the model names none")
    _check_block_size(block, max_block_size)
    return int(block)
