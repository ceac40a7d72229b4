"""data=text's tokens, made once: the corpus's tokens (training split first) streamed into a
memory-mapped file in the cache, keyed by the corpus's content and the tokenizer's identity, its
record written last, so that a second job reads the tokens instead of making them again and a
killed job leaves nothing a later one trusts."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Tuple

import numpy as np

from unitrain.data.text.corpus import HELD_OUT, TRAIN, Corpus, pieces, split_texts
from unitrain.data.text.data_config import DataConfig
from unitrain.data.text.job_tokenizer import TokenizerPlan
from unitrain.data.text.records import JsonRecord, cache_key
from unitrain.data.text.tokenizer import Tokenizer, UnknownCharacter
from unitrain.errors import ConfigError
from unitrain.host.atomic import replace_text


@dataclass(frozen=True, kw_only=True)
class TokenFile(JsonRecord):
    """A cache entry: the corpus's tokens (training split first), and the counts of each split
    (tokens, characters, UTF-8 bytes)."""

    file: Path
    dtype: str
    tokens: int
    train_tokens: int
    train_chars: int
    train_bytes: int
    held_out_chars: int
    held_out_bytes: int

    @classmethod
    def read(cls, file: Path) -> Optional["TokenFile"]:
        """The entry, when whole: its record written last, its size what the record says."""
        entry = cls.read_json(file.with_suffix(".json"), file=file)
        if entry is None:
            return None
        whole = file.is_file() and file.stat().st_size == entry.tokens * np.dtype(entry.dtype).itemsize
        return entry if whole else None

    def record(self) -> str:
        return self.json_text("file")


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 2**16 else "uint32"


def check_splits(cfg: DataConfig, block: int, train: int, held_out: int) -> None:
    """Each split must hold one sample: block_size + 1 tokens."""
    shortest, name = min((train, "training"), (held_out, "held-out"))
    if shortest >= block + 1:
        return
    why = f"a sample takes block_size + 1 tokens and the corpus's {name} split (data.val_fraction={cfg.val_fraction})"
    if shortest >= 2:
        raise ConfigError("data.block_size", block, f"at most {shortest - 1}: {why} has {shortest}")
    raise ConfigError("data.path", cfg.path, f"a longer corpus: {why} has {shortest} tokens, block_size={block}")


def token_entry(
    cfg: DataConfig, corpus: Corpus, plan: TokenizerPlan, start: int, block: int, cache: Path
) -> Tuple[TokenFile, bool]:
    """The cache's entry for this corpus and tokenizer (True), else one made now (False): written
    under a temporary name and renamed only once the splits are long enough, its record last,
    so a killed job leaves nothing a later one trusts."""
    tokenizer = plan.tokenizer
    key = cache_key(corpus.sha256, tokenizer.kind, tokenizer.vocab_size, tokenizer.sha256, start)
    final = cache / f"{key}.tokens"
    entry = TokenFile.read(final)
    if entry is not None:
        check_splits(cfg, block, entry.train_tokens, entry.tokens - entry.train_tokens)
        return entry, True
    cache.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(final)
    try:
        entry = _write_tokens(corpus, tokenizer, start, final, tmp)
        check_splits(cfg, block, entry.train_tokens, entry.tokens - entry.train_tokens)
        os.replace(tmp, final)
    except UnknownCharacter as err:
        allowed = f"text whose every character the given char tokenizer knows; {err.char!r} is not one of them"
        raise ConfigError("data.path", cfg.path, allowed) from None
    finally:
        tmp.unlink(missing_ok=True)
    replace_text(final.with_suffix(".json"), entry.record())
    return entry, False


def _encoded(tokenizer: Tokenizer, texts: Iterable[str]) -> Iterator[np.ndarray]:
    """``texts``'s tokens, a chunk at a time (BPE: a piece cut after a newline at a time)."""
    yield from map(tokenizer.encode_array, pieces(texts) if tokenizer.kind == "bpe" else texts)


def _write_tokens(corpus: Corpus, tokenizer: Tokenizer, start: int, final: Path, tmp: Path) -> TokenFile:
    """The corpus's tokens into ``tmp``, streamed; the entry describes them under ``final``."""
    dtype = token_dtype(tokenizer.vocab_size)
    counts = {TRAIN: [0, 0, 0], HELD_OUT: [0, 0, 0]}  # tokens, characters, bytes
    with open(tmp, "wb") as out:
        # One pass; each split is encoded on its own, so that no token spans the two.
        for part, texts in itertools.groupby(split_texts(corpus, start), key=lambda p: p[0]):
            for ids in _encoded(tokenizer, _counted((text for _, text in texts), counts[part])):
                out.write(ids.astype(dtype).tobytes())
                counts[part][0] += len(ids)
    return TokenFile(
        file=final,
        dtype=dtype,
        tokens=counts[TRAIN][0] + counts[HELD_OUT][0],
        train_tokens=counts[TRAIN][0],
        train_chars=counts[TRAIN][1],
        train_bytes=counts[TRAIN][2],
        held_out_chars=counts[HELD_OUT][1],
        held_out_bytes=counts[HELD_OUT][2],
    )


def _counted(texts: Iterable[str], counts: List[int]) -> Iterator[str]:
    for text in texts:
        counts[1] += len(text)
        counts[2] += len(text.encode("utf-8"))
        yield text


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")
