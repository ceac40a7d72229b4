"""data=text's tokens, made once: the corpus's tokens (training split first) streamed into a
memory-mapped file in the cache, keyed by the corpus's content and the tokenizer's identity, its
record written last, so that a second job reads the tokens instead of making them again and a
killed job leaves nothing a later one trusts.

The record holds the tokens' digest and is sealed with its own (:mod:`records`): each use reads
the tokens once, hashing them and finding the largest id, so that an entry changed since it was
written (ids shifted, a file of another corpus, a record edited or cut short) is made again with one
line that says so, and no token id outside the vocabulary reaches the model."""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Tuple

import numpy as np

from unitrain.data.text.corpus import HELD_OUT, TRAIN, Corpus, pieces, split_texts
from unitrain.data.text.data_config import DataConfig
from unitrain.data.text.job_tokenizer import TokenizerPlan
from unitrain.data.text.records import DIGEST_CHUNK, JsonRecord, cache_key, read_entry, temporary
from unitrain.data.text.tokenizer import Tokenizer, UnknownCharacter
from unitrain.errors import ConfigError
from unitrain.host.atomic import replace_text

log = logging.getLogger("unitrain")


@dataclass(frozen=True, kw_only=True)
class TokenFile(JsonRecord):
    """A cache entry: the corpus's tokens (training split first), the counts of each split
    (tokens, characters, UTF-8 bytes), and what the entry is checked against each time it is
    used: the key it was written under, its tokens' sha256 and largest id."""

    file: Path
    dtype: str
    tokens: int
    train_tokens: int
    train_chars: int
    train_bytes: int
    held_out_chars: int
    held_out_bytes: int
    key: str
    sha256: str
    max_id: int

    @classmethod
    def verified(cls, file: Path, key: str, vocab_size: int) -> Tuple[Optional["TokenFile"], str]:
        """The entry at ``file`` and "", when it holds what was written under ``key`` (its record
        sealed and whole, its tokens' size, digest and largest id as recorded, every id within
        ``vocab_size``); else None and what is wrong with it ("" where nothing is there)."""
        record = file.with_suffix(".json")
        fields, why = read_entry(file, record)
        if fields is None:
            return None, why
        try:
            entry = cls(file=file, **fields)
            itemsize = np.dtype(entry.dtype).itemsize
        except (TypeError, ValueError):
            return None, f"was damaged (its record {record.name} is not a token cache record)"
        if entry.key != key:
            return None, f"was damaged (its record {record.name} is another entry's)"
        try:
            size = file.stat().st_size
        except OSError:
            return None, f"was damaged (its tokens file is missing; its record says {entry.tokens} tokens)"
        if size != entry.tokens * itemsize:
            return None, f"was damaged (its tokens file holds {size} bytes; its record says {entry.tokens * itemsize})"
        try:
            digest, largest = _scan(file, entry.dtype)
        except (OSError, ValueError) as err:  # replaced or cut while read
            return None, f"was damaged (its tokens file cannot be read whole: {err})"
        if digest != entry.sha256:
            return None, "was damaged (its tokens are not those written: their sha256 differs from its record's)"
        if largest != entry.max_id or largest >= vocab_size:
            return None, f"was damaged (it holds token id {largest}; the tokenizer has {vocab_size} tokens)"
        return entry, ""

    def record(self) -> str:
        return self.sealed_text("file")


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
    """The cache's entry for this corpus and tokenizer (True), once verified, else one made now
    (False): written under a temporary name and renamed only once the splits are long enough, its
    record last, so a killed job leaves nothing a later one trusts. An entry that fails its check
    is made again, with one line that says why."""
    tokenizer = plan.tokenizer
    key = cache_key(corpus.sha256, tokenizer.kind, tokenizer.vocab_size, tokenizer.sha256, start)
    final = cache / f"{key}.tokens"
    entry, damaged = TokenFile.verified(final, key, tokenizer.vocab_size)
    if entry is not None:
        check_splits(cfg, block, entry.train_tokens, entry.tokens - entry.train_tokens)
        return entry, True
    cache.mkdir(parents=True, exist_ok=True)
    tmp = temporary(final)
    try:
        entry = _write_tokens(corpus, tokenizer, start, final, tmp, key)
        check_splits(cfg, block, entry.train_tokens, entry.tokens - entry.train_tokens)
        os.replace(tmp, final)
    except UnknownCharacter as err:
        allowed = f"text whose every character the given char tokenizer knows; {err.char!r} is not one of them"
        raise ConfigError("data.path", cfg.path, allowed) from None
    finally:
        tmp.unlink(missing_ok=True)
    replace_text(final.with_suffix(".json"), entry.record())  # last: the entry is whole
    if damaged:
        log.warning("token cache entry %s %s: made again", final, damaged)
    return entry, False


def _scan(file: Path, dtype: str) -> Tuple[str, int]:
    """A token file's sha256 and its largest id (-1 when empty), in one read."""
    digest, largest = hashlib.sha256(), -1
    with open(file, "rb") as stream:
        while chunk := stream.read(DIGEST_CHUNK):
            digest.update(chunk)
            largest = max(largest, int(np.frombuffer(chunk, dtype=dtype).max()))
    return digest.hexdigest(), largest


def _encoded(tokenizer: Tokenizer, texts: Iterable[str]) -> Iterator[np.ndarray]:
    """``texts``'s tokens, a chunk at a time (BPE: a piece cut after a newline at a time)."""
    yield from map(tokenizer.encode_array, pieces(texts) if tokenizer.kind == "bpe" else texts)


def _write_tokens(corpus: Corpus, tokenizer: Tokenizer, start: int, final: Path, tmp: Path, key: str) -> TokenFile:
    """The corpus's tokens into ``tmp``, streamed and hashed; the entry describes them under ``final``."""
    dtype = token_dtype(tokenizer.vocab_size)
    counts = {TRAIN: [0, 0, 0], HELD_OUT: [0, 0, 0]}  # tokens, characters, bytes
    digest, largest = hashlib.sha256(), -1
    with open(tmp, "wb") as out:
        # One pass; each split is encoded on its own, so that no token spans the two.
        for part, texts in itertools.groupby(split_texts(corpus, start), key=lambda p: p[0]):
            for ids in _encoded(tokenizer, _counted((text for _, text in texts), counts[part])):
                raw = ids.astype(dtype).tobytes()
                out.write(raw)
                digest.update(raw)
                largest = max(largest, int(ids.max())) if len(ids) else largest
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
        key=key,
        sha256=digest.hexdigest(),
        max_id=largest,
    )


def _counted(texts: Iterable[str], counts: List[int]) -> Iterator[str]:
    for text in texts:
        counts[1] += len(text)
        counts[2] += len(text.encode("utf-8"))
        yield text
