"""The tokenizer of a data=text job: the one passed, the run directory's saved one (a resumed
run), a BPE an earlier job trained on the same corpus (from the cache), or a new one; the record
of the corpus it was made from (tokenizer.corpus.json), and a saved one made from another
corpus refused: on resume (:func:`plan_tokenizer`), and for the model a run's checkpoint holds
(:func:`model_tokenizer`, generation)."""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from unitrain.data.text.corpus import PIECE_CHARS, TRAIN, Corpus, pieces, split_texts
from unitrain.data.text.data_config import DataConfig
from unitrain.data.text.records import JsonRecord, cache_key, read_entry
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
from unitrain.errors import ConfigError, Refusal

log = logging.getLogger("unitrain")


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
class BpeEntry(JsonRecord):
    """A BPE cache entry's record (``bpe-<key>.record.json``, sealed, written after the tokenizer):
    the key it was written under, the corpus and vocabulary it was trained for, the sha256 of the
    tokenizer's file."""

    key: str
    corpus_sha256: str
    vocab_size: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class TokenizerPlan:
    tokenizer: Tokenizer
    #: Files to write once every check has passed: path -> content.
    writes: Dict[Path, str]


#: What a refusal of a saved tokenizer allows.
_OWN_OR_NEW = "the tokenizer.json its run saved (with the corpus it was made from), or a new run directory"


def _replaced(file: Path, record: Optional[CorpusRecord]) -> Optional[str]:
    """Why ``file`` is not the tokenizer its record (written with it) describes ("is not ..."); None
    when it is, or has no record."""
    if record is None or hashlib.sha256(file.read_bytes()).hexdigest() == record.tokenizer_sha256:
        return None
    return (
        f"is not the tokenizer {record_path(file).name} beside it records (a {record.kind} tokenizer of "
        f"{record.vocab_size} tokens made from {record.corpus_path}): it was made from another corpus"
    )


def _checked_saved(file: Path, cfg: DataConfig, corpus: Corpus) -> Tokenizer:
    """A saved tokenizer for this job: refused, naming the file, when it is not the one its record
    describes or cannot encode the corpus (it was made from another corpus); refused on data.path
    when its record names another corpus; of another kind or size than the config asks for."""
    tokenizer = load_tokenizer(file)
    record = CorpusRecord.read(file)
    replaced = _replaced(file, record)
    if replaced:
        raise ConfigError("tokenizer", str(file), f"{_OWN_OR_NEW}; this one {replaced}")
    if record is not None and record.corpus_sha256 != corpus.sha256:
        raise ConfigError(
            "data.path",
            cfg.path,
            f"the corpus that {file} was made from ({record.corpus_path}, {record.corpus_bytes} bytes, sha256 "
            f"{record.corpus_sha256[:12]}); this one's sha256 is {corpus.sha256[:12]}: give that corpus, or a new "
            "run directory",
        )
    if isinstance(tokenizer, CharTokenizer):
        unknown = sorted(set(corpus.alphabet) - set(tokenizer.chars))
        if unknown:
            raise ConfigError(
                "tokenizer",
                str(file),
                f"{_OWN_OR_NEW}; this one cannot encode {unknown[0]!r}, one of {len(unknown)} characters of "
                f"data.path={cfg.path} it lacks: it was made from another corpus",
            )
    if tokenizer.kind != str(cfg.tokenizer):
        raise ConfigError("data.tokenizer", str(cfg.tokenizer), f"{tokenizer.kind}, the kind of {file}")
    if tokenizer.kind == "bpe" and tokenizer.vocab_size != cfg.vocab_size:
        raise ConfigError("data.vocab_size", cfg.vocab_size, f"{tokenizer.vocab_size}, the size of {file}")
    return tokenizer


def model_tokenizer(
    run_dir: Path, classes: int, data: Mapping[str, Any], corpus_sha256: Optional[str], model: str
) -> Tokenizer:
    """The tokenizer ``run_dir`` saved, for the model ``model`` (a checkpoint, as a message names
    it) trained on ``classes`` tokens with ``data`` (the data section of its config;
    ``corpus_sha256``: the corpus's, where the run's summary says it). Refused in one line naming
    the file where it is not the one that model was trained with: another vocabulary or kind, not
    the tokenizer its record describes, or a record naming another corpus."""
    file = tokenizer_path(run_dir)
    tokenizer = load_tokenizer(file)
    record = CorpusRecord.read(file)
    replaced = _replaced(file, record)
    why = f"{file} {replaced}" if replaced else None
    path, kind = data.get("path"), data.get("tokenizer")
    if why is None and tokenizer.vocab_size != classes:
        why = (
            f"{file} holds a {tokenizer.kind} tokenizer of {tokenizer.vocab_size} tokens, and {model} was trained on "
            f"{classes}: it was made from another corpus"
        )
    elif why is None and kind and tokenizer.kind != str(kind):
        why = f"{file} holds a {tokenizer.kind} tokenizer, and {model} was trained with data.tokenizer={kind}"
    elif why is None and record is not None and not _same_corpus(record, corpus_sha256, path):
        why = (
            f"{file} was made from {record.corpus_path} (sha256 {record.corpus_sha256[:12]}), and {model} was "
            f"trained on data.path={path}: it was made from another corpus"
        )
    if why:
        raise Refusal(f"{why}; allowed: the tokenizer.json its run saved as it trained")
    return tokenizer


def _same_corpus(record: CorpusRecord, sha256: Optional[str], path: Optional[str]) -> bool:
    """Whether ``record`` names the corpus of sha256 ``sha256`` (where known) or, else, at
    ``path`` (a path relative to a folder unknown here: its last parts)."""
    if sha256:
        return record.corpus_sha256 == sha256
    if not path:
        return True
    given = Path(os.path.normpath(path))
    if given.is_absolute():
        return Path(record.corpus_path) in (given, given.resolve())
    parts = tuple(part for part in given.parts if part != "..")
    return not parts or Path(record.corpus_path).parts[-len(parts) :] == parts


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
    """The corpus's characters, or a BPE trained on its training split (from the cache when an
    earlier job trained the same one and the entry holds what it wrote; trained again, with one
    line, when it does not)."""
    if str(cfg.tokenizer) == "char":
        return CharTokenizer(corpus.alphabet), {}
    lib = tokenizers_library()
    key = cache_key("bpe", corpus.sha256, start, cfg.vocab_size, PIECE_CHARS, lib.__version__)
    cached = cache / f"bpe-{key}.json"
    tokenizer, damaged = _cached_bpe(cached, key, corpus, cfg.vocab_size)
    if tokenizer is not None:
        return tokenizer, {}
    training = itertools.takewhile(lambda part: part[0] == TRAIN, split_texts(corpus, start))
    tokenizer = train_bpe(pieces(text for _, text in training), cfg.vocab_size)
    if tokenizer.vocab_size < cfg.vocab_size:
        raise ConfigError(
            "data.vocab_size",
            cfg.vocab_size,
            f"at most {tokenizer.vocab_size}: BPE on this corpus's training split runs out of merges there",
        )
    if damaged:
        log.warning("BPE cache entry %s %s: trained again", cached, damaged)
    record = BpeEntry(key=key, corpus_sha256=corpus.sha256, vocab_size=tokenizer.vocab_size, sha256=tokenizer.sha256)
    # The record after the tokenizer (the writes are made in this order): the entry is whole.
    return tokenizer, {cached: tokenizer.to_json(), bpe_record_path(cached): record.sealed_text()}


def bpe_record_path(cached: Path) -> Path:
    return cached.with_suffix(".record.json")


def _cached_bpe(cached: Path, key: str, corpus: Corpus, vocab_size: int) -> Tuple[Optional[Tokenizer], str]:
    """The BPE cache entry ``cached`` and "", when it holds what was written under ``key`` for this
    corpus and vocabulary; else None and what is wrong with it ("" where nothing is there)."""
    record_file = bpe_record_path(cached)
    fields, why = read_entry(cached, record_file)
    if fields is None:
        return None, why
    try:
        record = BpeEntry(**fields)
    except TypeError:
        return None, f"was damaged (its record {record_file.name} is not a BPE cache record)"
    if (record.key, record.corpus_sha256, record.vocab_size) != (key, corpus.sha256, vocab_size):
        return None, f"was damaged (its record {record_file.name} is another entry's)"
    try:
        text = cached.read_bytes()
    except OSError:
        return None, "was damaged (its tokenizer file is missing)"
    if hashlib.sha256(text).hexdigest() != record.sha256:
        return None, "was damaged (its tokenizer file is not the one written: its sha256 differs from its record's)"
    try:
        tokenizer = tokenizer_from_json(text.decode("utf-8"), str(cached))
    except (ConfigError, UnicodeDecodeError) as err:
        return None, f"was damaged (its tokenizer file cannot be read: {err})"
    if tokenizer.kind != "bpe" or tokenizer.vocab_size != vocab_size:
        return None, f"was damaged (it holds a {tokenizer.kind} tokenizer of {tokenizer.vocab_size} tokens)"
    return tokenizer, ""
