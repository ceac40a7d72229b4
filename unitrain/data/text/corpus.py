"""data=text's corpus: its files (one file, or a folder's ``*.txt`` files in name order) read as
one stream and checked (NUL bytes, UTF-8, not empty), its split at the held-out start, and its text
re-cut into pieces that do not depend on where a read ended."""

from __future__ import annotations

import codecs
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Tuple

from unitrain.data.text.data_config import DataConfig
from unitrain.errors import ConfigError

#: Bytes read at a time: memory stays bounded whatever the corpus's size.
CHUNK_BYTES = 1 << 20
#: BPE encodes and trains on pieces of at most this many characters, cut after a newline, so
#: that the tokens do not depend on where a read happened to end.
PIECE_CHARS = 1 << 16
#: The two splits: the corpus's start, and its last data.val_fraction.
TRAIN, HELD_OUT = 0, 1


@dataclass(frozen=True, kw_only=True)
class Corpus:
    """A corpus's files, read once: their content's hash and size, and its characters."""

    path: str
    files: Tuple[Path, ...]
    sha256: str
    bytes: int
    chars: int
    #: The distinct characters, sorted: the char tokenizer's vocabulary.
    alphabet: str


def corpus_files(path: str, key: str = "data.path") -> Tuple[Path, ...]:
    """The file ``path`` names, or its folder's ``*.txt`` files in name order."""
    where = Path(path)
    if where.is_dir():
        files = tuple(sorted((f for f in where.glob("*.txt") if f.is_file()), key=lambda f: f.name))
        if not files:
            raise ConfigError(key, path, "a folder holding *.txt files (read in name order); it holds none")
        return files
    if where.is_file():
        return (where,)
    raise ConfigError(key, path, "an existing UTF-8 text file, or a folder of *.txt files; nothing is there")


def check_text_files(cfg: DataConfig, key: str = "data.path") -> Corpus:
    """The corpus data.path names, every byte read and checked (NUL bytes, UTF-8, not empty);
    nothing is written."""
    files = corpus_files(cfg.path, key)
    digest, size, chars, alphabet = hashlib.sha256(), 0, 0, set()
    for file in files:
        for raw, text in _file_chunks(file, key):
            digest.update(raw)
            size, chars = size + len(raw), chars + len(text)
            alphabet.update(text)
    if chars == 0:
        what = "file" if len(files) == 1 else "folder's *.txt files"
        raise ConfigError(key, cfg.path, f"a non-empty UTF-8 text; this {what} holds no text")
    return Corpus(
        path=str(cfg.path),
        files=files,
        sha256=digest.hexdigest(),
        bytes=size,
        chars=chars,
        alphabet="".join(sorted(alphabet)),
    )


def _file_chunks(file: Path, key: str) -> Iterator[Tuple[bytes, str]]:
    """(raw bytes, their text) a chunk at a time; a NUL byte or bytes that are not UTF-8 are one
    line naming the file and the byte's offset."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(file, "rb") as stream:
        while raw := stream.read(CHUNK_BYTES):
            nul = raw.find(b"\0")
            if nul >= 0:
                allowed = f"a text file; this one holds a NUL byte at byte offset {offset + nul} (binary data?)"
                raise ConfigError(key, str(file), allowed)
            pending = len(decoder.getstate()[0])
            yield raw, _decode(decoder, raw, False, file, offset - pending, key)
            offset += len(raw)
    _decode(decoder, b"", True, file, offset - len(decoder.getstate()[0]), key)


def _decode(decoder: Any, raw: bytes, final: bool, file: Path, start: int, key: str) -> str:
    try:
        return decoder.decode(raw, final)
    except UnicodeDecodeError as err:
        # err.start counts from the bytes the decoder held back from the previous chunk.
        bad = start + err.start
        byte = err.object[err.start]
        raise ConfigError(
            key, str(file), f"UTF-8 text; the byte at offset {bad} (0x{byte:02x}) is not valid UTF-8"
        ) from None


def held_out_start(chars: int, val_fraction: float) -> int:
    """The character where the held-out split begins: the last ``val_fraction`` of the corpus."""
    return chars - int(round(chars * val_fraction))


def split_texts(corpus: Corpus, start: int) -> Iterator[Tuple[int, str]]:
    """(TRAIN or HELD_OUT, text) through the corpus, cut at character ``start``."""
    seen = 0
    for file in corpus.files:
        for _, text in _file_chunks(file, "data.path"):
            if seen < start < seen + len(text):
                yield TRAIN, text[: start - seen]
                yield HELD_OUT, text[start - seen :]
            elif text:
                yield (TRAIN if seen < start else HELD_OUT), text
            seen += len(text)


def pieces(texts: Iterable[str], size: int = PIECE_CHARS) -> Iterator[str]:
    """``texts`` re-cut into pieces of at most ``size`` characters, each ending after its last
    newline (a longer line is cut where it must): a function of the text alone, not of where
    reads happened to end, so the same corpus always gives the same tokens."""
    carry = ""
    for text in texts:
        carry += text
        pos = 0
        while len(carry) - pos >= size:
            cut = carry.rfind("\n", pos, pos + size) + 1 or pos + size
            yield carry[pos:cut]
            pos = cut
        carry = carry[pos:]
    if carry:
        yield carry
