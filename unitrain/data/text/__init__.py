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

Its modules, each importing only those above it in this list:

* ``tokenizer``: the char and byte-level BPE tokenizers, their kinds (KINDS, data.tokenizer's
  values), their file read back;
* ``data_config``: DataConfig, what data=text reads of the config, and the checks of the config
  alone;
* ``corpus``: the corpus's files read and checked, its splits, its text cut into pieces;
* ``records``: JSON records read back only when whole, the cache's keys, its entries' records
  sealed with their own digest, and what killed jobs left in it;
* ``job_tokenizer``: the tokenizer of a job (given, saved in the run, cached and verified, or
  new) and the record of its corpus;
* ``token_cache``: the tokens, made once, in a memory-mapped cache entry verified each time it is
  used;
* ``windows``: the splits as samples, and load_text, the entry point.

The names other layers use are re-exported here.
"""

from unitrain.data.text.corpus import (
    CHUNK_BYTES,
    HELD_OUT,
    PIECE_CHARS,
    TRAIN,
    Corpus,
    check_text_files,
    corpus_files,
    held_out_start,
)
from unitrain.data.text.data_config import DataConfig, check_text_config, resolve_block_size
from unitrain.data.text.job_tokenizer import CorpusRecord, TokenizerPlan, plan_tokenizer
from unitrain.data.text.records import CACHE_FORMAT
from unitrain.data.text.token_cache import TokenFile, token_dtype
from unitrain.data.text.tokenizer import (
    BYTE_ALPHABET,
    KINDS,
    MAX_VOCAB,
    MIN_BPE_VOCAB,
    SPECIAL_TOKENS,
    TOKENIZER_FILE,
    BpeTokenizer,
    CharTokenizer,
    Tokenizer,
    UnknownCharacter,
    load_tokenizer,
    record_path,
    tokenizer_from_json,
    tokenizer_path,
    train_bpe,
)
from unitrain.data.text.windows import TextCorpus, TokenWindows, load_text

__all__ = [
    "BYTE_ALPHABET",
    "CACHE_FORMAT",
    "CHUNK_BYTES",
    "HELD_OUT",
    "KINDS",
    "MAX_VOCAB",
    "MIN_BPE_VOCAB",
    "PIECE_CHARS",
    "SPECIAL_TOKENS",
    "TOKENIZER_FILE",
    "TRAIN",
    "BpeTokenizer",
    "CharTokenizer",
    "Corpus",
    "CorpusRecord",
    "DataConfig",
    "TextCorpus",
    "TokenFile",
    "TokenWindows",
    "Tokenizer",
    "TokenizerPlan",
    "UnknownCharacter",
    "check_text_config",
    "check_text_files",
    "corpus_files",
    "held_out_start",
    "load_text",
    "load_tokenizer",
    "plan_tokenizer",
    "record_path",
    "resolve_block_size",
    "token_dtype",
    "tokenizer_from_json",
    "tokenizer_path",
    "train_bpe",
]
