"""The tokenizer of a data=text job: the one passed, the run directory's saved one (a resumed
run), a BPE an earlier job trained on the same corpus (from the cache), or a new one; the record
of the corpus it was made from (tokenizer.corpus.json), and a saved one made from another
corpus refused."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from unitrain.data.text.corpus import PIECE_CHARS, TRAIN, Corpus, pieces, split_texts
from unitrain.data.text.data_config import DataConfig
from unitrain.data.text.records import JsonRecord, cache_key
from unitrain.data.text.tokenizer import (
    TOKENIZER_FILE,
    CharTokenizer,
    Tokenizer,
    load_tokenizer,
    record_path,
    tokenizer_from_json,
    tokenizer_path,
    tokenizers_library,
    train_bpe,
)
from unitrain.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class CorpusRecord(JsonRecord):
    """What a saved tokenizer was made from (tokenizer.corpus.json)."""

    kind: str
    vocab_size: int
    tokenizer_sha256: str
    corpus_sha256: str
    corpus_bytes: int
    corpus_path: str
    val_fraction: float

    @classmethod
    def read(cls, file: Path) -> Optional["CorpusRecord"]:
        """The record beside the tokenizer ``file``, None without one."""
        return cls.read_json(record_path(file))


@dataclass(frozen=True, kw_only=True)
class TokenizerPlan:
    tokenizer: Tokenizer
    #: Files to write once every check has passed: path -> content.
    writes: Dict[Path, str]


def _checked_saved(file: Path, cfg: DataConfig, corpus: Corpus) -> Tokenizer:
    """A saved tokenizer for this job: refused when made from another corpus, or of another
    kind or size than the config asks for."""
    tokenizer = load_tokenizer(file)
    record = CorpusRecord.read(file)
    if record is not None and record.corpus_sha256 != corpus.sha256:
        raise ConfigError(
            "data.path",
            cfg.path,
            f"the corpus that {file} was made from ({record.corpus_path}, {record.corpus_bytes} bytes, sha256 "
            f"{record.corpus_sha256[:12]}); this one's sha256 is {corpus.sha256[:12]}: give that corpus, or a new "
            "run directory",
        )
    if tokenizer.kind != str(cfg.tokenizer):
        raise ConfigError("data.tokenizer", str(cfg.tokenizer), f"{tokenizer.kind}, the kind of {file}")
    if tokenizer.kind == "bpe" and tokenizer.vocab_size != cfg.vocab_size:
        raise ConfigError("data.vocab_size", cfg.vocab_size, f"{tokenizer.vocab_size}, the size of {file}")
    return tokenizer


def _record(tokenizer: Tokenizer, cfg: DataConfig, corpus: Corpus) -> str:
    record = CorpusRecord(
        kind=tokenizer.kind,
        vocab_size=tokenizer.vocab_size,
        tokenizer_sha256=tokenizer.sha256,
        corpus_sha256=corpus.sha256,
        corpus_bytes=corpus.bytes,
        corpus_path=str(Path(corpus.path).resolve()),
        val_fraction=cfg.val_fraction,
    )
    return record.json_text()


def _saved_writes(file: Path, tokenizer: Tokenizer, cfg: DataConfig, corpus: Corpus) -> Dict[Path, str]:
    return {file: tokenizer.to_json(), record_path(file): _record(tokenizer, cfg, corpus)}


def plan_tokenizer(
    cfg: DataConfig,
    corpus: Corpus,
    start: int,
    run_dir: Optional[Path],
    tokenizer_file: Optional[Path],
    cache: Path,
) -> TokenizerPlan:
    """The job's tokenizer: the one passed, else the run directory's (a resumed run), else a
    new one; what to write is returned, not written, so that a later refusal leaves nothing."""
    own = Path(run_dir) / TOKENIZER_FILE if run_dir is not None else None
    saved = own if own is not None and own.is_file() else None
    if tokenizer_file is not None:
        tokenizer = _checked_saved(tokenizer_path(tokenizer_file), cfg, corpus)
        if saved is not None and load_tokenizer(saved).sha256 != tokenizer.sha256:
            raise ConfigError("tokenizer", str(tokenizer_file), f"the run directory's own tokenizer, {saved}")
        writes = _saved_writes(own, tokenizer, cfg, corpus) if own is not None and saved is None else {}
        return TokenizerPlan(tokenizer=tokenizer, writes=writes)
    if saved is not None:
        return TokenizerPlan(tokenizer=_checked_saved(saved, cfg, corpus), writes={})
    tokenizer, writes = _new_tokenizer(cfg, corpus, start, cache)
    if own is not None:
        writes.update(_saved_writes(own, tokenizer, cfg, corpus))
    return TokenizerPlan(tokenizer=tokenizer, writes=writes)


def _new_tokenizer(cfg: DataConfig, corpus: Corpus, start: int, cache: Path) -> Tuple[Tokenizer, Dict[Path, str]]:
    """The corpus's characters, or a BPE trained on its training split (from the cache when
    an earlier job trained the same one)."""
    if str(cfg.tokenizer) == "char":
        return CharTokenizer(corpus.alphabet), {}
    lib = tokenizers_library()
    key = cache_key("bpe", corpus.sha256, start, cfg.vocab_size, PIECE_CHARS, lib.__version__)
    cached = cache / f"bpe-{key}.json"
    if cached.is_file():
        return tokenizer_from_json(cached.read_text(encoding="utf-8"), str(cached)), {}
    training = itertools.takewhile(lambda part: part[0] == TRAIN, split_texts(corpus, start))
    tokenizer = train_bpe(pieces(text for _, text in training), cfg.vocab_size)
    if tokenizer.vocab_size < cfg.vocab_size:
        raise ConfigError(
            "data.vocab_size",
            cfg.vocab_size,
            f"at most {tokenizer.vocab_size}: BPE on this corpus's training split runs out of merges there",
        )
    return tokenizer, {cached: tokenizer.to_json()}
