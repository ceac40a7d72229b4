"""data=text's corpus, tokenizers, splits, samples and token cache (unitrain/data/text/), on
tiny corpora written here: every refusal is one line raised before anything is written."""

from __future__ import annotations

import math
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from unitrain.config.schema import DataConfig, Tokenizer
from unitrain.data import text
from unitrain.data.text import (
    TOKENIZER_FILE,
    check_text_config,
    check_text_files,
    job_tokenizer,
    load_text,
    load_tokenizer,
    record_path,
    token_dtype,
)
from unitrain.data.text import corpus as text_corpus
from unitrain.errors import ConfigError
from unitrain.host.cache import cache_root

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the a of and to in was she he it her his that with for had not but at by which you said be as".split()


def prose(seed: int, words: int = 1500) -> str:
    """Seeded English-like text, with punctuation, line breaks and a few non-ASCII characters."""
    rng = random.Random(seed)
    lines, line = [], []
    for i in range(words):
        line.append(rng.choice(WORDS + ["Émile", "naïve", "café", "Darcy,", "said."]))
        if i % 11 == 10:
            lines.append(" ".join(line))
            line = []
    return "\n".join(lines) + "\n"


def config(path, **kw) -> DataConfig:
    return DataConfig(name="text", path=str(path), **kw)


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(prose(0), encoding="utf-8")
    return path


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"


def refused(call, *args, **kw) -> str:
    with pytest.raises(ConfigError) as err:
        call(*args, **kw)
    message = str(err.value)
    assert "\n" not in message
    return message


def nothing_written(*folders: Path) -> bool:
    return all(not f.exists() or not any(f.iterdir()) for f in folders)


# ---------------------------------------------------------------------------------------------
# The config alone


@pytest.mark.parametrize(
    "keys, named",
    [
        ({"val_fraction": 0.0}, "data.val_fraction=0.0"),
        ({"val_fraction": 0.6}, "data.val_fraction=0.6"),
        ({"val_fraction": -0.1}, "data.val_fraction=-0.1"),
        ({"val_fraction": float("nan")}, "data.val_fraction=nan"),
        ({"tokenizer": "bpe", "vocab_size": 255}, "data.vocab_size=255"),
        ({"block_size": 0}, "data.block_size=0"),
    ],
)
def test_the_config_alone_refuses_each_bad_value_in_one_line(tmp_path, keys, named):
    message = refused(check_text_config, config(tmp_path / "nowhere.txt", **keys))
    assert message.startswith(named)


def test_the_tokenizer_kinds_are_the_schemas():
    assert text.KINDS == Tokenizer.values()


def test_the_config_alone_needs_a_path_and_a_block_that_fits_the_model(tmp_path):
    assert refused(check_text_config, DataConfig(name="text")).startswith("data.path=None")
    cfg = config(tmp_path / "nowhere.txt", block_size=65)
    assert "at most 64, the model's context length" in refused(check_text_config, cfg, max_block_size=64)
    check_text_config(cfg, max_block_size=65)
    # char ignores vocab_size, and the config alone opens no file.
    check_text_config(config(tmp_path / "nowhere.txt", tokenizer="char", vocab_size=3))
    check_text_config(config(tmp_path / "nowhere.txt", tokenizer="bpe", vocab_size=256, val_fraction=0.5))


# ---------------------------------------------------------------------------------------------
# The files: each bad input is one line, and nothing is written


def bad_file(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    return path


@pytest.mark.parametrize(
    "content, says",
    [
        (b"", "holds no text"),
        (b"plain text\0 and a NUL", "NUL byte at byte offset 10"),
        ("h\u00e9llo".encode("latin-1"), "the byte at offset 1 (0xe9) is not valid UTF-8"),
        ("abc\u00e9".encode()[:-1], "the byte at offset 3 (0xc3) is not valid UTF-8"),
    ],
)
def test_a_bad_file_is_one_line_naming_it_and_nothing_is_written(tmp_path, cache, content, says):
    path = bad_file(tmp_path, content)
    run = tmp_path / "run"
    message = refused(load_text, config(path), 8, run, cache_dir=cache)
    assert message.startswith(f"data.path={str(path)!r}") and says in message
    assert nothing_written(cache, run)


def test_the_offset_of_a_bad_byte_counts_across_reads(tmp_path, monkeypatch):
    # Reads of 3 bytes: the é is cut in two between reads, and the bad byte comes reads later.
    monkeypatch.setattr(text_corpus, "CHUNK_BYTES", 3)
    path = bad_file(tmp_path, ("x" * 10 + "\u00e9").encode() + b"\xff" + b"tail")
    assert "the byte at offset 12 (0xff)" in refused(check_text_files, config(path))
    path.write_bytes(("x" * 10 + "\u00e9").encode())
    assert check_text_files(config(path)).chars == 11


def test_a_missing_path_and_a_folder_without_text_files_are_refused(tmp_path, cache):
    missing = tmp_path / "missing.txt"
    assert "nothing is there" in refused(load_text, config(missing), 8, cache_dir=cache)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.md").write_text(prose(1))
    assert "holding *.txt files" in refused(load_text, config(folder), 8, cache_dir=cache)
    assert nothing_written(cache)


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_a_split_shorter_than_a_sample_names_the_block_size_that_fits(tmp_path, cache, tokenizer):
    path = tmp_path / "short.txt"
    path.write_text("abcdefghij" * 10)  # 100 characters: 10 held out
    cfg = config(path, tokenizer=tokenizer, vocab_size=256)
    run = tmp_path / "run"
    message = refused(load_text, cfg, 64, run, cache_dir=cache)
    assert message.startswith("data.block_size=64") and "held-out split" in message
    fits = int(message.split("at most ")[1].split(":")[0])
    assert nothing_written(cache, run)
    corpus = load_text(cfg, fits, run, cache_dir=cache)
    assert len(corpus.held_out) == 1
    path.write_text("abc")
    assert refused(load_text, config(path), 1, cache_dir=tmp_path / "other").startswith("data.path=")


def test_the_block_size_is_the_models_unless_set_and_never_longer(corpus, cache):
    assert load_text(config(corpus), 16, cache_dir=cache).train.block_size == 16
    assert load_text(config(corpus, block_size=8), 16, cache_dir=cache).train.block_size == 8
    message = refused(load_text, config(corpus, block_size=32), 16, max_block_size=16, cache_dir=cache)
    assert message.startswith("data.block_size=32") and "at most 16" in message
    assert refused(load_text, config(corpus), None, cache_dir=cache).startswith("data.block_size=None")


def test_a_bpe_vocabulary_larger_than_the_corpus_allows_says_the_largest(tmp_path, cache):
    path = tmp_path / "small.txt"
    path.write_text(prose(2, words=300))
    run = tmp_path / "run"
    message = refused(load_text, config(path, tokenizer="bpe", vocab_size=5000), 8, run, cache_dir=cache)
    assert message.startswith("data.vocab_size=5000")
    largest = int(message.split("at most ")[1].split(":")[0])
    assert 256 < largest < 5000 and nothing_written(cache, run)
    assert load_text(config(path, tokenizer="bpe", vocab_size=largest), 8, run, cache_dir=cache).vocab_size == largest
    assert refused(load_text, config(path, tokenizer="bpe", vocab_size=100), 8, cache_dir=cache).startswith(
        "data.vocab_size=100"
    )


# ---------------------------------------------------------------------------------------------
# Tokenizers, splits and samples


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_tokenizers_round_trip_and_are_saved_in_the_run_directory(corpus, cache, tmp_path, tokenizer):
    run = tmp_path / "run"
    loaded = load_text(config(corpus, tokenizer=tokenizer, vocab_size=300), 16, run, cache_dir=cache)
    assert loaded.tokenizer_file == run / TOKENIZER_FILE and record_path(run / TOKENIZER_FILE).is_file()
    saved = load_tokenizer(run)
    assert (saved.kind, saved.vocab_size, saved.sha256) == (tokenizer, loaded.vocab_size, loaded.tokenizer.sha256)
    content = corpus.read_text()
    samples = [content, content[:100], "", "naïve café\n\nÉmile said."]
    if tokenizer == "bpe":
        samples += ["tabs\tand\r\nCRLF, emoji 🙂 and 漢字", "<|endoftext|>"]
    for s in samples:
        assert saved.decode(saved.encode(s)) == s
    assert saved.decode([saved.start_token()]) == "\n"
    assert loaded.train.num_classes == loaded.held_out.num_classes == saved.vocab_size


def test_char_vocabulary_is_the_corpus_sorted_characters(corpus, cache):
    loaded = load_text(config(corpus), 16, cache_dir=cache)
    assert loaded.tokenizer.chars == "".join(sorted(set(corpus.read_text())))
    assert loaded.train.unit == "character" and loaded.train.bits(math.log(2)) == pytest.approx(1.0)


def test_the_held_out_split_is_the_last_fraction_and_disjoint(corpus, cache):
    content = corpus.read_text()
    loaded = load_text(config(corpus, val_fraction=0.25), 16, cache_dir=cache)
    ids = np.asarray(loaded.tokenizer.encode(content))
    held = round(len(content) * 0.25)
    assert (loaded.held_out.tokens, loaded.train.tokens) == (held, len(content) - held)
    assert np.array_equal(loaded.train.array(), ids[:-held]) and np.array_equal(loaded.held_out.array(), ids[-held:])
    assert loaded.train.stop == loaded.held_out.start


def test_bpe_is_trained_on_the_training_split_and_splits_the_text_at_its_end(corpus, cache):
    content = corpus.read_text()
    loaded = load_text(config(corpus, tokenizer="bpe", vocab_size=300), 16, cache_dir=cache)
    decode = loaded.tokenizer.decode
    held_text = content[text.held_out_start(len(content), 0.1) :]
    assert decode(loaded.held_out.array().tolist()) == held_text
    assert decode(loaded.train.array().tolist()) + held_text == content
    assert loaded.held_out.text_bytes == len(held_text.encode())
    bits = loaded.held_out.bits(1.0)
    assert loaded.held_out.unit == "byte" and bits == pytest.approx(
        loaded.held_out.tokens / len(held_text.encode()) / math.log(2)
    )


def test_sample_i_is_the_window_from_token_i_and_the_next_token(corpus, cache):
    loaded = load_text(config(corpus, tokenizer="bpe", vocab_size=300), 16, cache_dir=cache)
    for split in (loaded.train, loaded.held_out):
        tokens = np.asarray(split.array(), dtype=np.int64)
        assert len(split) == split.tokens - 16
        for i in (0, 7, len(split) - 1):
            x, y = split[i]
            assert x.dtype == y.dtype == np.int64 and x.shape == y.shape == (16,)
            assert np.array_equal(x, tokens[i : i + 16]) and np.array_equal(y, tokens[i + 1 : i + 17])
        with pytest.raises(IndexError):
            split[len(split)]
    disjoint = loaded.held_out.with_stride(16)
    assert np.array_equal(disjoint[1][0], loaded.held_out[16][0])
    assert len(disjoint) == (loaded.held_out.tokens - 17) // 16 + 1


def test_a_split_pickles_without_its_tokens_and_maps_them_again(corpus, cache):
    split = load_text(config(corpus), 16, cache_dir=cache).train
    expected = split[5]
    copy = pickle.loads(pickle.dumps(split))
    assert len(pickle.dumps(split)) < 2000
    assert all(np.array_equal(a, b) for a, b in zip(copy[5], expected))


def test_a_folder_reads_its_text_files_in_name_order(tmp_path, cache):
    folder = tmp_path / "books"
    folder.mkdir()
    parts = {"b.txt": prose(3, 200), "10.txt": prose(4, 200), "a.txt": prose(5, 200)}
    for name, content in parts.items():
        (folder / name).write_text(content)
    (folder / "skip.md").write_text("not read\n")
    loaded = load_text(config(folder), 8, cache_dir=cache)
    decoded = loaded.tokenizer.decode(np.concatenate([loaded.train.array(), loaded.held_out.array()]).tolist())
    assert decoded == parts["10.txt"] + parts["a.txt"] + parts["b.txt"]
    assert [f.name for f in loaded.corpus.files] == ["10.txt", "a.txt", "b.txt"]


# ---------------------------------------------------------------------------------------------
# The token cache


def test_a_second_load_reuses_the_cache_and_a_changed_corpus_gets_its_own(corpus, cache, tmp_path):
    first = load_text(config(corpus), 16, tmp_path / "run1", cache_dir=cache)
    stamp = first.tokens.file.stat().st_mtime_ns
    second = load_text(config(corpus), 16, tmp_path / "run2", cache_dir=cache)
    assert (first.reused, second.reused) == (False, True)
    assert second.tokens.file == first.tokens.file and first.tokens.file.stat().st_mtime_ns == stamp
    corpus.write_text(corpus.read_text() + "one more line\n")
    third = load_text(config(corpus), 16, tmp_path / "run3", cache_dir=cache)
    assert not third.reused and third.tokens.file != first.tokens.file
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]


def test_a_second_bpe_job_neither_retrains_nor_retokenizes(corpus, cache, tmp_path, monkeypatch):
    cfg = config(corpus, tokenizer="bpe", vocab_size=300)
    first = load_text(cfg, 16, tmp_path / "run1", cache_dir=cache)
    monkeypatch.setattr(job_tokenizer, "train_bpe", lambda *a: pytest.fail("trained again"))
    second = load_text(cfg, 16, tmp_path / "run2", cache_dir=cache)
    assert second.reused and second.tokenizer.sha256 == first.tokenizer.sha256


def test_half_a_cache_entry_is_not_trusted(corpus, cache):
    first = load_text(config(corpus), 16, cache_dir=cache)
    expected = first.train[3]
    with open(first.tokens.file, "r+b") as f:  # as a killed writer would leave it: cut short
        f.truncate(10)
    again = load_text(config(corpus), 16, cache_dir=cache)
    assert not again.reused and all(np.array_equal(a, b) for a, b in zip(again.train[3], expected))


def test_the_token_file_is_uint16_until_the_vocabulary_needs_uint32(tmp_path, cache):
    assert (token_dtype(2**16), token_dtype(2**16 + 1)) == ("uint16", "uint32")
    path = tmp_path / "many.txt"
    many = [chr(c) for c in range(0x100, 0x100 + 70_000) if not 0xD800 <= c < 0xE000]
    path.write_text("".join(many) * 2, encoding="utf-8")
    loaded = load_text(config(path), 8, cache_dir=cache)
    assert loaded.vocab_size == len(many) and loaded.tokens.dtype == "uint32"
    assert loaded.train.array().dtype == np.uint32
    assert loaded.tokenizer.decode(loaded.train[0][0].tolist()) == "".join(many[:8])


def test_the_cache_root_follows_unitrain_cache_then_xdg(tmp_path, monkeypatch, corpus):
    monkeypatch.setenv("UNITRAIN_CACHE", str(tmp_path / "u"))
    assert cache_root() == tmp_path / "u"
    assert load_text(config(corpus), 8).tokens.file.parent == tmp_path / "u" / "text"
    monkeypatch.delenv("UNITRAIN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x" / "unitrain"


# ---------------------------------------------------------------------------------------------
# Resume


def test_resume_uses_the_runs_tokenizer_and_refuses_one_from_another_corpus(corpus, cache, tmp_path):
    run = tmp_path / "run"
    cfg = config(corpus, tokenizer="bpe", vocab_size=300)
    first = load_text(cfg, 16, run, cache_dir=cache)
    again = load_text(cfg, 16, run, cache_dir=tmp_path / "fresh-cache")
    assert again.tokenizer.sha256 == first.tokenizer.sha256
    other = tmp_path / "other.txt"
    other.write_text(prose(9))
    message = refused(load_text, config(other, tokenizer="bpe", vocab_size=300), 16, run, cache_dir=cache)
    assert message.startswith(f"data.path={str(other)!r}") and "the corpus that" in message
    assert refused(load_text, config(corpus, tokenizer="char"), 16, run, cache_dir=cache).startswith(
        "data.tokenizer='char'"
    )
    assert refused(load_text, config(corpus, tokenizer="bpe", vocab_size=301), 16, run, cache_dir=cache).startswith(
        "data.vocab_size=301"
    )


def test_a_tokenizer_file_passed_explicitly_is_checked_and_kept_in_the_run(corpus, cache, tmp_path):
    first = load_text(config(corpus), 16, tmp_path / "run1", cache_dir=cache)
    run = tmp_path / "run2"
    loaded = load_text(config(corpus), 16, run, tokenizer_file=tmp_path / "run1" / TOKENIZER_FILE, cache_dir=cache)
    assert loaded.reused and load_tokenizer(run).sha256 == first.tokenizer.sha256
    other = tmp_path / "other.txt"
    other.write_text("zzz " + prose(9))
    with_record = tmp_path / "run1" / TOKENIZER_FILE
    assert "the corpus that" in refused(load_text, config(other), 16, tokenizer_file=with_record, cache_dir=cache)
    os.remove(record_path(with_record))  # a foreign file: its characters must still cover the corpus
    message = refused(load_text, config(other), 16, tokenizer_file=with_record, cache_dir=cache)
    assert message.startswith(f"tokenizer={str(with_record)!r}") and "cannot encode 'z'" in message


def _foreign_char_tokenizer(corpus: Path, tmp_path: Path, cache: Path) -> Path:
    """The tokenizer.json (and its record) of a run on another corpus: as many characters as
    ``corpus``'s, one of them another."""
    own = sorted(set(corpus.read_text(encoding="utf-8")))
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text(encoding="utf-8").replace(own[-1], "\u2603"), encoding="utf-8")
    load_text(config(other), 16, tmp_path / "other-run", cache_dir=cache)
    return tmp_path / "other-run" / TOKENIZER_FILE


@pytest.mark.parametrize("with_its_record", [False, True], ids=["tokenizer-alone", "with-its-record"])
def test_on_resume_a_tokenizer_from_another_corpus_is_blamed_not_the_corpus(corpus, cache, tmp_path, with_its_record):
    """Before: a run's tokenizer.json replaced by another corpus's was refused as
    "data.path=... 'H' is not one of them"; now the line names the tokenizer file (or, when its
    record came with it, says which corpus it was made from), and nothing is written."""
    import shutil

    run = tmp_path / "run"
    load_text(config(corpus), 16, run, cache_dir=cache)
    foreign = _foreign_char_tokenizer(corpus, tmp_path, cache)
    shutil.copy(foreign, run / TOKENIZER_FILE)
    if with_its_record:
        shutil.copy(record_path(foreign), record_path(run / TOKENIZER_FILE))
    resumed = tmp_path / "resumed"
    message = refused(load_text, config(corpus), 16, resumed, tokenizer_file=run / TOKENIZER_FILE, cache_dir=cache)
    if with_its_record:  # the tokenizer and its record agree: it was made from the other corpus
        assert f"the corpus that {run / TOKENIZER_FILE} was made from ({tmp_path / 'other.txt'}" in message, message
    else:
        assert message.startswith(f"tokenizer={str(run / TOKENIZER_FILE)!r} is not allowed: the tokenizer.json")
        assert "is not the tokenizer tokenizer.corpus.json beside it records" in message, message
        os.remove(record_path(run / TOKENIZER_FILE))  # no record: its characters are checked
        message = refused(load_text, config(corpus), 16, resumed, tokenizer_file=run / TOKENIZER_FILE, cache_dir=cache)
        assert message.startswith(f"tokenizer={str(run / TOKENIZER_FILE)!r}") and "cannot encode" in message
        assert "made from another corpus" in message and "or a new run directory" in message
    assert not resumed.exists()


# ---------------------------------------------------------------------------------------------
# The default corpus


def test_the_default_corpus_is_over_a_megabyte_of_prose():
    path = ROOT / yaml.safe_load((ROOT / "conf" / "data" / "text.yaml").read_text())["path"]
    if not path.exists():
        pytest.skip(f"the default corpus is not made ({path}): `make corpus`")
    corpus = check_text_files(config(path))
    assert corpus.bytes > 1_000_000 and len(corpus.files) == 6
    assert 60 <= len(corpus.alphabet) <= 100
