"""data=text: a corpus of UTF-8 text as next-token samples, the same on both frameworks.

The corpus (one file, or a folder's ``*.txt`` files in name order, read as one stream) is
tokenized once, by characters (nanoGPT's shakespeare_char) or by a byte-level BPE trained on the
training split, into a memory-mapped token file in the cache, keyed by the corpus's content and
the tokenizer's identity: a corpus larger than memory trains, and a second job reads the tokens
instead of making them again. The last ``val_fraction`` of the corpus is held out. Sample i of a
split is the window of ``block_size`` tokens starting at its token i and the same window shifted
by one, so the shared sampler's index stream gives both frameworks, and every data-parallel rank,
the same blocks in the same order.

The tokenizer is saved in the run directory (``tokenizer.json``, with ``tokenizer.corpus.json``
beside it naming the corpus it was made from), so that a resumed run, an export and generation
use the very same one; a run directory's tokenizer made from another corpus is refused.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from unitrain.errors import ConfigError
from unitrain.host.atomic import replace_text
from unitrain.host.cache import cache_dir as cache_folder

#: Bytes read at a time: memory stays bounded whatever the corpus's size.
CHUNK_BYTES = 1 << 20
#: BPE encodes and trains on pieces of at most this many characters, cut after a newline, so
#: that the tokens do not depend on where a read happened to end.
PIECE_CHARS = 1 << 16
#: The tokenizer's file in a run directory (the record of its corpus beside it: record_path).
TOKENIZER_FILE = "tokenizer.json"
#: Bumped whenever what a cache entry holds would change for the same corpus and tokenizer.
CACHE_FORMAT = 1
#: Byte-level BPE starts from the 256 bytes. No special tokens: the corpus is one stream with
#: nothing to mark, and a special token would break the round trip of a text that contains its
#: spelling.
BYTE_ALPHABET = 256
SPECIAL_TOKENS: Tuple[str, ...] = ()
MIN_BPE_VOCAB = BYTE_ALPHABET + len(SPECIAL_TOKENS)
#: Tokens are stored as uint32 at most.
MAX_VOCAB = 2**32
TRAIN, HELD_OUT = 0, 1
#: data.tokenizer's values (the schema's Tokenizer choice; config/ sits above data/, so it is
#: not imported here, and tests/test_text_data.py checks that the two agree).
KINDS = ("char", "bpe")


class DataConfig(Protocol):
    """What data=text reads of a DataConfig (unitrain.config.schema), or of its DictConfig."""

    path: Optional[str]
    tokenizer: Any
    vocab_size: int
    block_size: Optional[int]
    val_fraction: float


# ---------------------------------------------------------------------------------------------
# The config alone (preflight), and the corpus's files


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


def _split_texts(corpus: Corpus, start: int) -> Iterator[Tuple[int, str]]:
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


def _pieces(texts: Iterable[str], size: int = PIECE_CHARS) -> Iterator[str]:
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


# ---------------------------------------------------------------------------------------------
# Tokenizers


class Tokenizer(Protocol):
    """What a run's tokenizer offers training, export and generation."""

    #: "char" or "bpe".
    kind: str
    vocab_size: int
    #: The hash of its file's content: its identity in the token cache's key.
    sha256: str

    def encode(self, text: str) -> List[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_array(self, text: str) -> np.ndarray: ...

    def start_token(self) -> int: ...

    def to_json(self) -> str: ...


class UnknownCharacter(ValueError):
    """A character that a char tokenizer's vocabulary lacks."""

    def __init__(self, char: str):
        self.char = char
        super().__init__(f"{char!r} is not in the tokenizer's characters")


class CharTokenizer:
    """One token per character: the corpus's distinct characters, sorted (nanoGPT's
    shakespeare_char), vectorized through their code points."""

    kind = "char"

    def __init__(self, chars: str):
        self.chars = chars
        self.vocab_size = len(chars)
        self._points = np.array([ord(c) for c in chars], dtype=np.uint32)
        self.sha256 = hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def encode_array(self, text: str) -> np.ndarray:
        points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
        ids = np.minimum(np.searchsorted(self._points, points), max(self.vocab_size - 1, 0))
        unknown = np.flatnonzero(self._points[ids] != points) if self.vocab_size else np.arange(len(points))
        if len(unknown):
            raise UnknownCharacter(text[unknown[0]])
        return ids.astype(np.int64)

    def encode(self, text: str) -> List[int]:
        return self.encode_array(text).tolist()

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def start_token(self) -> int:
        """A newline's token (nanoGPT's sample.py starts from one), else the first."""
        return max(self.chars.find("\n"), 0)

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "chars": list(self.chars)}, ensure_ascii=False, indent=0)


class BpeTokenizer:
    """A byte-level BPE of the ``tokenizers`` library: every text encodes, and decodes back
    to itself."""

    kind = "bpe"

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.sha256 = hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def encode(self, text: str) -> List[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int64)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def start_token(self) -> int:
        return self.encode("\n")[0]

    def to_json(self) -> str:
        return self._tokenizer.to_str()


def _tokenizers_library() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise ConfigError(
            "data.tokenizer", "bpe", "char, or bpe once the tokenizers package is installed (pip install tokenizers)"
        ) from None
    return tokenizers


def train_bpe(texts: Iterable[str], vocab_size: int) -> BpeTokenizer:
    """A byte-level BPE of at most ``vocab_size`` tokens trained on ``texts`` (GPT-2's
    pre-tokenizer, no prefix space, so that decode(encode(s)) == s)."""
    lib = _tokenizers_library()
    bpe = lib.Tokenizer(lib.models.BPE())
    bpe.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = lib.decoders.ByteLevel()
    trainer = lib.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=lib.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    return BpeTokenizer(bpe)


def tokenizer_from_json(text: str, source: str = "tokenizer") -> Tokenizer:
    """A tokenizer from its file's content: unitrain's char tokenizer, else the BPE library's."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("kind") == "char" and isinstance(data.get("chars"), list):
        return CharTokenizer("".join(data["chars"]))
    if not isinstance(data, dict) or "model" not in data:
        raise ConfigError("tokenizer", source, "a tokenizer.json that data=text wrote (char or bpe)")
    try:
        return BpeTokenizer(_tokenizers_library().Tokenizer.from_str(text))
    except Exception as err:  # the library's own error type is not exported
        raise ConfigError("tokenizer", source, f"a tokenizer.json the tokenizers library reads: {err}") from None


def tokenizer_path(where: Path | str) -> Path:
    """A run directory's tokenizer file, or ``where`` itself when it names a file."""
    where = Path(where)
    return where / TOKENIZER_FILE if where.is_dir() or where.suffix != ".json" else where


def record_path(tokenizer_file: Path) -> Path:
    """Where the record of the corpus a tokenizer was made from sits: beside it."""
    return tokenizer_file.with_name(tokenizer_file.stem + ".corpus.json")


def load_tokenizer(where: Path | str) -> Tokenizer:
    """The tokenizer a data=text run saved: ``where`` is its run directory or the file."""
    file = tokenizer_path(where)
    if not file.is_file():
        raise ConfigError("tokenizer", str(where), f"a run directory holding {TOKENIZER_FILE} (data=text writes it)")
    return tokenizer_from_json(file.read_text(encoding="utf-8"), str(file))


# ---------------------------------------------------------------------------------------------
# The tokenizer of a job: the run's saved one, a cached BPE, or a new one


@dataclass(frozen=True, kw_only=True)
class CorpusRecord:
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
        try:
            return cls(**json.loads(record_path(file).read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return None


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
    return json.dumps(dataclasses.asdict(record), indent=1) + "\n"


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
    lib = _tokenizers_library()
    key = _digest([CACHE_FORMAT, "bpe", corpus.sha256, start, cfg.vocab_size, PIECE_CHARS, lib.__version__])
    cached = cache / f"bpe-{key}.json"
    if cached.is_file():
        return tokenizer_from_json(cached.read_text(encoding="utf-8"), str(cached)), {}
    training = itertools.takewhile(lambda part: part[0] == TRAIN, _split_texts(corpus, start))
    tokenizer = train_bpe(_pieces(text for _, text in training), cfg.vocab_size)
    if tokenizer.vocab_size < cfg.vocab_size:
        raise ConfigError(
            "data.vocab_size",
            cfg.vocab_size,
            f"at most {tokenizer.vocab_size}: BPE on this corpus's training split runs out of merges there",
        )
    return tokenizer, {cached: tokenizer.to_json()}


def _digest(parts: list) -> str:
    return hashlib.sha256(json.dumps(parts).encode("utf-8")).hexdigest()[:32]


# ---------------------------------------------------------------------------------------------
# Tokens: a memory-mapped file in the cache


@dataclass(frozen=True, kw_only=True)
class TokenFile:
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
        try:
            entry = cls(file=file, **json.loads(file.with_suffix(".json").read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return None
        whole = file.is_file() and file.stat().st_size == entry.tokens * np.dtype(entry.dtype).itemsize
        return entry if whole else None

    def record(self) -> str:
        fields = dataclasses.asdict(self)
        del fields["file"]
        return json.dumps(fields, indent=1) + "\n"


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 2**16 else "uint32"


def _encoded(tokenizer: Tokenizer, texts: Iterable[str]) -> Iterator[np.ndarray]:
    """``texts``'s tokens, a chunk at a time (BPE: a piece cut after a newline at a time)."""
    yield from map(tokenizer.encode_array, _pieces(texts) if tokenizer.kind == "bpe" else texts)


def _write_tokens(corpus: Corpus, tokenizer: Tokenizer, start: int, final: Path, tmp: Path) -> TokenFile:
    """The corpus's tokens into ``tmp``, streamed; the entry describes them under ``final``."""
    dtype = token_dtype(tokenizer.vocab_size)
    counts = {TRAIN: [0, 0, 0], HELD_OUT: [0, 0, 0]}  # tokens, characters, bytes
    with open(tmp, "wb") as out:
        # One pass; each split is encoded on its own, so that no token spans the two.
        for part, texts in itertools.groupby(_split_texts(corpus, start), key=lambda p: p[0]):
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


# ---------------------------------------------------------------------------------------------
# The datasets


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


def _windows(entry: TokenFile, part: int, block: int, vocab_size: int, kind: str) -> TokenWindows:
    train = part == TRAIN
    return TokenWindows(
        file=entry.file,
        dtype=entry.dtype,
        total=entry.tokens,
        start=0 if train else entry.train_tokens,
        stop=entry.train_tokens if train else entry.tokens,
        block_size=block,
        num_classes=vocab_size,
        text_chars=entry.train_chars if train else entry.held_out_chars,
        text_bytes=entry.train_bytes if train else entry.held_out_bytes,
        unit="character" if kind == "char" else "byte",
    )


def _check_splits(cfg: DataConfig, block: int, train: int, held_out: int) -> None:
    """Each split must hold one sample: block_size + 1 tokens."""
    shortest, name = min((train, "training"), (held_out, "held-out"))
    if shortest >= block + 1:
        return
    why = f"a sample takes block_size + 1 tokens and the corpus's {name} split (data.val_fraction={cfg.val_fraction})"
    if shortest >= 2:
        raise ConfigError("data.block_size", block, f"at most {shortest - 1}: {why} has {shortest}")
    raise ConfigError("data.path", cfg.path, f"a longer corpus: {why} has {shortest} tokens, block_size={block}")


# ---------------------------------------------------------------------------------------------
# The entry point


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
    ``cache_root()/text``, made here). Every refusal is one ConfigError, raised before anything is written."""
    check_text_config(cfg, max_block_size)
    block = resolve_block_size(cfg, block_size, max_block_size)
    corpus = check_text_files(cfg)
    start = held_out_start(corpus.chars, cfg.val_fraction)
    if str(cfg.tokenizer) == "char":
        _check_splits(cfg, block, start, corpus.chars - start)  # tokens are characters: known already
    cache = Path(cache_dir) if cache_dir is not None else cache_folder("text")
    plan = plan_tokenizer(
        cfg, corpus, start, Path(run_dir) if run_dir else None, Path(tokenizer_file) if tokenizer_file else None, cache
    )
    entry, reused = _token_entry(cfg, corpus, plan, start, block, cache)
    for path, content in plan.writes.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_text(path, content)
    own = Path(run_dir) / TOKENIZER_FILE if run_dir else None
    kind, vocab = plan.tokenizer.kind, plan.tokenizer.vocab_size
    return TextCorpus(
        train=_windows(entry, TRAIN, block, vocab, kind),
        held_out=_windows(entry, HELD_OUT, block, vocab, kind),
        tokenizer=plan.tokenizer,
        corpus=corpus,
        tokens=entry,
        reused=reused,
        tokenizer_file=own if own is not None and own.is_file() else None,
    )


def _token_entry(
    cfg: DataConfig, corpus: Corpus, plan: TokenizerPlan, start: int, block: int, cache: Path
) -> Tuple[TokenFile, bool]:
    """The cache's entry for this corpus and tokenizer (True), else one made now (False): written
    under a temporary name and renamed only once the splits are long enough, its record last,
    so a killed job leaves nothing a later one trusts."""
    tokenizer = plan.tokenizer
    key = _digest([CACHE_FORMAT, corpus.sha256, tokenizer.kind, tokenizer.vocab_size, tokenizer.sha256, start])
    final = cache / f"{key}.tokens"
    entry = TokenFile.read(final)
    if entry is not None:
        _check_splits(cfg, block, entry.train_tokens, entry.tokens - entry.train_tokens)
        return entry, True
    cache.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(final)
    try:
        entry = _write_tokens(corpus, tokenizer, start, final, tmp)
        _check_splits(cfg, block, entry.train_tokens, entry.tokens - entry.train_tokens)
        os.replace(tmp, final)
    except UnknownCharacter as err:
        allowed = f"text whose every character the given char tokenizer knows; {err.char!r} is not one of them"
        raise ConfigError("data.path", cfg.path, allowed) from None
    finally:
        tmp.unlink(missing_ok=True)
    replace_text(final.with_suffix(".json"), entry.record())
    return entry, False
