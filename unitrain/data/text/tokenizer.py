"""data=text's tokenizers: one token per character, or a byte-level BPE; the kinds they are,
their file read back, and where a run directory keeps it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, List, Protocol, Sequence, Tuple

import numpy as np

from unitrain.errors import ConfigError

#: The tokenizer's file in a run directory (the record of its corpus beside it: record_path).
TOKENIZER_FILE = "tokenizer.json"
#: Byte-level BPE starts from the 256 bytes. No special tokens: the corpus is one stream with
#: nothing to mark, and a special token would break the round trip of a text that contains its
#: spelling.
BYTE_ALPHABET = 256
SPECIAL_TOKENS: Tuple[str, ...] = ()
MIN_BPE_VOCAB = BYTE_ALPHABET + len(SPECIAL_TOKENS)
#: Tokens are stored as uint32 at most.
MAX_VOCAB = 2**32


class Tokenizer(Protocol):
    """What a run's tokenizer offers training, export and generation."""

    #: One of KINDS.
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


#: data.tokenizer's values, one per tokenizer class above. Declared here only: the schema's
#: Tokenizer choice (unitrain.config.schema, a layer above) is built from them, and
#: tests/test_text_data.py checks that it is.
KINDS: Tuple[str, ...] = (CharTokenizer.kind, BpeTokenizer.kind)


def tokenizers_library() -> Any:
    """The ``tokenizers`` package, imported when BPE is asked for; one line where it is missing."""
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
    lib = tokenizers_library()
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
        return BpeTokenizer(tokenizers_library().Tokenizer.from_str(text))
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
