"""What a language model's export takes and is checked on (data=text), for the language task
(:mod:`unitrain.tasks.language`) to answer export, quantization and inference with: int64 token
ids whose time axis an exporter keeps dynamic up to the context (:class:`TokenIds`), the
manifest's ``input`` entry, the corpus's held-out windows re-read with the run's tokenizer (or
seeded random ids where they cannot be), and its training windows for calibration. The block size
is the caller's (the task's ``block_size``): nothing here reads a model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, Optional, Tuple

import numpy as np

from unitrain.data import text
from unitrain.errors import ConfigError, UnitrainError

#: Where an export keeps the run's tokenizer, and the record of the corpus it was made from (the
#: first is the one the held-out windows are re-read with).
TOKENIZER_FILES = (text.TOKENIZER_FILE, text.record_path(Path(text.TOKENIZER_FILE)).name)


class TokenIds(np.ndarray):
    """int64 token ids ``[batch, time]`` whose time axis an exporter keeps dynamic, from 1 to
    ``max_length`` tokens (the model's context): what a language model's example is. A plain
    array's shape is kept but for its batch, as for images."""

    max_length: int


def token_ids(ids: np.ndarray, max_length: int) -> TokenIds:
    example = np.ascontiguousarray(ids, dtype=np.int64).view(TokenIds)
    example.max_length = int(max_length)
    return example


@dataclass(frozen=True)
class RandomTokens:
    """Seeded token ids in [0, ``num_classes``), window i a pure function of (seed, i): the
    check data of a language model whose corpus cannot be read again."""

    samples: int
    block_size: int
    num_classes: int
    seed: int

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        window = np.random.default_rng([self.seed, index]).integers(0, self.num_classes, self.block_size + 1)
        return window[:-1].astype(np.int64), window[1:].astype(np.int64)


def corpus_config(cfg: Any, tokenizer: Path) -> Any:
    """data=text's keys with the corpus found: data.path as the job gave it (relative to where it
    ran), else the absolute path the tokenizer's corpus record holds."""
    path = str(cfg.data.path)
    record = text.CorpusRecord.read(tokenizer)
    if not Path(path).exists() and record is not None and Path(record.corpus_path).exists():
        path = record.corpus_path
    keys = ("tokenizer", "vocab_size", "block_size", "val_fraction")
    return SimpleNamespace(path=path, **{k: cfg.data[k] for k in keys})


def held_out(
    cfg: Any, block: int, samples: int, tokenizer: Optional[Path], vocab_size: Optional[int]
) -> Tuple[Any, str]:
    """The corpus's held-out split as disjoint windows of ``block`` tokens (every held-out token
    predicted once, as the trainer's evaluation does), tokenized by the run's own tokenizer;
    where the corpus is gone, changed, or the tokenizer is missing, ``samples`` windows of seeded
    random ids in [0, vocab_size), and the description says which and why."""
    vocab = int(vocab_size or cfg.data.vocab_size)
    if tokenizer is None or not Path(tokenizer).is_file():
        why = f"the run's tokenizer ({tokenizer or text.TOKENIZER_FILE}) is missing"
    else:
        data = corpus_config(cfg, Path(tokenizer))
        try:
            corpus = text.load_text(data, block_size=block, max_block_size=block, tokenizer_file=tokenizer)
        except ConfigError as err:
            why = f"the corpus cannot be read again ({err})"
        else:
            windows = corpus.held_out.with_stride(block)
            if corpus.vocab_size == vocab:
                return windows, (
                    f"held-out token windows of {data.path} ({len(windows)} windows of {block} tokens, the last "
                    f"{data.val_fraction:g} of the corpus, {corpus.tokenizer.kind} tokenizer of the run)"
                )
            why = f"the run's tokenizer has {corpus.vocab_size} tokens, the model {vocab}"
    return RandomTokens(samples, block, vocab, int(cfg.trainer.seed)), (
        f"random token ids in [0, {vocab}) ({samples} windows of {block} tokens, seeded): {why}"
    )


def training_windows(cfg: Any, block: int, tokenizer: Optional[Path]) -> Any:
    """The corpus's training split as disjoint windows of ``block`` tokens, tokenized by the run's
    ``tokenizer``: what a quantizer calibrates a language model on."""
    if tokenizer is None or not tokenizer.is_file():
        raise UnitrainError(
            f"calibrating a language model needs its run's tokenizer ({tokenizer}), which is missing; allowed: "
            "method=dynamic (no calibration data)"
        )
    try:
        data = corpus_config(cfg, tokenizer)
        corpus = text.load_text(data, block_size=block, max_block_size=block, tokenizer_file=tokenizer)
    except ConfigError as err:
        raise UnitrainError(
            f"calibrating a language model reads its corpus's training split, which cannot be read again: {err}; "
            "allowed: method=dynamic (no calibration data)"
        ) from None
    return corpus.train.with_stride(block)


def input_entry(kind: str, block: int, vocab_size: int, tokenizer: Optional[str]) -> Dict[str, Any]:
    """The manifest's ``input`` of a language model's export: int64 ids ``[batch, time]``, both
    axes dynamic, at most ``block`` tokens, ids below ``vocab_size``; ``tokenizer``: its file in
    the export directory (None: the run had none)."""
    return {
        "kind": kind,
        "dtype": "int64",
        "shape": [None, None],
        "axes": ["batch", "time"],
        "max_length": block,
        "vocab_size": int(vocab_size),
        "tokenizer": tokenizer,
    }
