"""data=text's samples: a split of the corpus's tokens as windows (TokenWindows), what a job is
given (TextCorpus), and load_text, the entry point that checks, tokenizes and maps the corpus."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np

from unitrain.data.text.corpus import Corpus, check_text_files, held_out_start
from unitrain.data.text.data_config import DataConfig, check_text_config, resolve_block_size
from unitrain.data.text.job_tokenizer import plan_tokenizer
from unitrain.data.text.records import clean_leftovers
from unitrain.data.text.token_cache import TokenFile, check_splits, token_entry
from unitrain.data.text.tokenizer import TOKENIZER_FILE, Tokenizer
from unitrain.host.atomic import replace_text
from unitrain.host.cache import cache_dir as cache_folder

log = logging.getLogger("unitrain")


@dataclass(kw_only=True)
class TokenWindows:
    """A split of the corpus as samples (the SampleSet protocol): sample i is the window of
    ``block_size`` tokens from the split's token ``i * stride``, and the same window one token on."""

    file: Path
    dtype: str
    #: The whole token file's length, and this split's tokens within it: [start, stop).
    total: int
    start: int
    stop: int
    block_size: int
    #: The vocabulary's size: the classes every position predicts.
    num_classes: int
    #: The split's text: characters and UTF-8 bytes, for bits per character / byte.
    text_chars: int
    text_bytes: int
    #: What bits are counted per: "character" (char) or "byte" (bpe).
    unit: str
    stride: int = 1
    #: At most this many windows (the first ones at this stride); None: every window.
    count: Optional[int] = None
    _tokens: Optional[np.ndarray] = field(default=None, init=False, repr=False, compare=False)

    @property
    def tokens(self) -> int:
        return self.stop - self.start

    @property
    def bytes_per_token(self) -> float:
        return self.text_bytes / self.tokens

    def __len__(self) -> int:
        windows = max(0, (self.tokens - self.block_size - 1) // self.stride + 1)
        return windows if self.count is None else min(windows, self.count)

    def array(self) -> np.ndarray:
        """The split's tokens, memory-mapped (opened on first use, in each loader process)."""
        if self._tokens is None:
            whole = np.memmap(self.file, dtype=self.dtype, mode="r", shape=(self.total,))
            self._tokens = whole[self.start : self.stop]
        return self._tokens

    def __getitem__(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        s = index * self.stride
        window = np.asarray(self.array()[s : s + self.block_size + 1], dtype=np.int64)
        return window[:-1], window[1:]

    def bits(self, loss: float) -> float:
        """A mean loss per token (nats) as bits per character (char) or per UTF-8 byte (bpe)."""
        units = self.text_chars if self.unit == "character" else self.text_bytes
        return loss * self.tokens / units / math.log(2)

    def with_stride(self, stride: int) -> "TokenWindows":
        """The same split with windows ``stride`` tokens apart (``block_size``: disjoint windows,
        a cheaper held-out evaluation)."""
        return dataclasses.replace(self, stride=stride)

    def spread(self, count: int) -> "TokenWindows":
        """``count`` disjoint windows spread evenly over the split (all disjoint ones when it
        holds fewer): an estimate of the whole split's loss at a fraction of its cost."""
        stride = max(self.block_size, (self.tokens - self.block_size - 1) // max(1, count - 1))
        return dataclasses.replace(self, stride=stride, count=count)

    def __getstate__(self) -> Dict[str, Any]:
        # A loader worker maps the file itself: pickling the memmap would copy every token.
        return {**self.__dict__, "_tokens": None}


@dataclass(frozen=True, kw_only=True)
class TextCorpus:
    """What data=text gives a job: both splits, the tokenizer, where the tokens are."""

    train: TokenWindows
    held_out: TokenWindows
    tokenizer: Tokenizer
    corpus: Corpus
    tokens: TokenFile
    #: Whether the tokens came from the cache (an earlier job made them) rather than this call.
    reused: bool
    #: The tokenizer's file in the run directory (None without one).
    tokenizer_file: Optional[Path]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def summary(self) -> Dict[str, Any]:
        """For summary.json's "text" section."""
        return {
            "tokenizer": self.tokenizer.kind,
            "vocab_size": self.vocab_size,
            "block_size": self.train.block_size,
            "unit": self.train.unit,
            "corpus_bytes": self.corpus.bytes,
            "corpus_sha256": self.corpus.sha256,
            "train_tokens": self.train.tokens,
            "held_out_tokens": self.held_out.tokens,
            "held_out_bytes_per_token": round(self.held_out.bytes_per_token, 4),
        }


def _windows(entry: TokenFile, train: bool, block: int, tokenizer: Tokenizer) -> TokenWindows:
    """The training split's windows (``train``), else the held-out split's."""
    return TokenWindows(
        file=entry.file,
        dtype=entry.dtype,
        total=entry.tokens,
        start=0 if train else entry.train_tokens,
        stop=entry.train_tokens if train else entry.tokens,
        block_size=block,
        num_classes=tokenizer.vocab_size,
        text_chars=entry.train_chars if train else entry.held_out_chars,
        text_bytes=entry.train_bytes if train else entry.held_out_bytes,
        unit="character" if tokenizer.kind == "char" else "byte",
    )


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size:,} bytes"


def load_text(
    cfg: DataConfig,
    block_size: Optional[int] = None,
    run_dir: Optional[Path | str] = None,
    *,
    max_block_size: Optional[int] = None,
    tokenizer_file: Optional[Path | str] = None,
    cache_dir: Optional[Path | str] = None,
) -> TextCorpus:
    """data=text's training and held-out sets. ``block_size``: the model's context length, used
    when data.block_size is unset; ``max_block_size``: the longest the model takes; ``run_dir``:
    where the tokenizer is saved (and found again on resume); ``tokenizer_file``: a saved
    tokenizer to use instead of making one; ``cache_dir``: the token cache (default
    ``cache_root()/text``, made here; what killed jobs left there is removed, and an entry that fails
    its check is made again). Every refusal is one ConfigError, raised before anything is written."""
    check_text_config(cfg, max_block_size)
    block = resolve_block_size(cfg, block_size, max_block_size)
    corpus = check_text_files(cfg)
    start = held_out_start(corpus.chars, cfg.val_fraction)
    if str(cfg.tokenizer) == "char":
        check_splits(cfg, block, start, corpus.chars - start)  # tokens are characters: known already
    cache = Path(cache_dir) if cache_dir is not None else cache_folder("text")
    removed = clean_leftovers(cache)
    if removed:
        log.info("removed %s that killed jobs left in the token cache %s", _size(removed), cache)
    plan = plan_tokenizer(
        cfg, corpus, start, Path(run_dir) if run_dir else None, Path(tokenizer_file) if tokenizer_file else None, cache
    )
    entry, reused = token_entry(cfg, corpus, plan, start, block, cache)
    for path, content in plan.writes.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_text(path, content)
    own = Path(run_dir) / TOKENIZER_FILE if run_dir else None
    return TextCorpus(
        train=_windows(entry, True, block, plan.tokenizer),
        held_out=_windows(entry, False, block, plan.tokenizer),
        tokenizer=plan.tokenizer,
        corpus=corpus,
        tokens=entry,
        reused=reused,
        tokenizer_file=own if own is not None and own.is_file() else None,
    )
