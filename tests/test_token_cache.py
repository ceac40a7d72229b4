"""data=text's caches verify what they trust (unitrain/data/text/token_cache.py, job_tokenizer.py,
records.py): a token entry or a BPE entry changed since it was written (ids shifted, ids outside
the vocabulary, a record edited or cut short, another corpus's or vocabulary's entry under this
one's name) is made again with one line that says so, never blamed on data.path nor named by a
key the user never set; what killed jobs left in the cache goes when it is next used, a live
job's stays. Tiny corpora, in-process load_text."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from unitrain.config.schema import DataConfig
from unitrain.data.text import job_tokenizer, load_text, records
from unitrain.data.text.records import SEAL, sealed_text

LINES = ["it is a truth universally acknowledged", "that a single man in possession", "of a good fortune"]


def prose(seed: int, lines: int = 400) -> str:
    rng = np.random.default_rng(seed)
    return "\n".join(" ".join(rng.permutation(LINES[i % 3].split())) for i in range(lines)) + "\n"


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


def _lines(caplog) -> list:
    return [r.getMessage() for r in caplog.records if r.name == "unitrain" and r.levelno >= logging.WARNING]


def _all_tokens(loaded) -> np.ndarray:
    return np.concatenate([loaded.train.array(), loaded.held_out.array()])


def _rewrite_record(entry_file: Path, **changes) -> None:
    """A record changed and sealed again, as a consistent forgery would be."""
    record = entry_file.with_suffix(".json")
    fields = json.loads(record.read_text())
    fields.pop(SEAL)
    record.write_text(sealed_text({**fields, **changes}))


# ---------------------------------------------------------------------------------------------
# The token cache


@pytest.mark.parametrize("damage", ["shifted", "0xFFFF", "0xFFFF, record sealed again"])
def test_tokens_changed_at_the_same_size_are_made_again_and_said(corpus, cache, caplog, damage):
    first = load_text(config(corpus), 16, cache_dir=cache)
    expected = _all_tokens(first).copy()
    tokens = np.memmap(first.tokens.file, dtype=first.tokens.dtype, mode="r+")
    tokens[:] = (tokens + 1) % first.vocab_size if damage == "shifted" else 0xFFFF
    tokens.flush()
    del tokens
    if damage == "0xFFFF, record sealed again":  # its digest right: the largest id still tells
        _rewrite_record(first.tokens.file, sha256=records.file_digest(first.tokens.file), max_id=0xFFFF)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="unitrain"):
        again = load_text(config(corpus), 16, cache_dir=cache)
    assert not again.reused and np.array_equal(_all_tokens(again), expected)
    assert int(again.train[len(again.train) - 1][1].max()) < again.vocab_size  # no IndexError downstream
    (line,) = _lines(caplog)
    assert line.startswith(f"token cache entry {first.tokens.file} was damaged (") and line.endswith(": made again")
    assert "data.path" not in line
    third = load_text(config(corpus), 16, cache_dir=cache)
    assert third.reused and np.array_equal(_all_tokens(third), expected)


@pytest.mark.parametrize(
    "damage", ["held-out split emptied", "record cut short", "record deleted", "record unsealed", "tokens deleted"]
)
def test_a_damaged_record_is_made_again_not_blamed_on_the_corpus(corpus, cache, caplog, damage):
    first = load_text(config(corpus), 16, cache_dir=cache)
    record = first.tokens.file.with_suffix(".json")
    fields = json.loads(record.read_text())
    if damage == "held-out split emptied":  # edited by hand, its seal left as it was
        record.write_text(json.dumps({**fields, "train_tokens": fields["tokens"]}))
    elif damage == "record cut short":
        record.write_text(record.read_text()[:40])
    elif damage == "record deleted":  # a job killed between the tokens' rename and the record
        record.unlink()
    elif damage == "record unsealed":  # as unitrain wrote entries before they were verified
        record.write_text(json.dumps({k: v for k, v in fields.items() if k != SEAL}))
    else:
        first.tokens.file.unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="unitrain"):
        again = load_text(config(corpus), 16, cache_dir=cache)
    assert not again.reused and again.held_out.tokens == first.held_out.tokens > 16
    assert np.array_equal(_all_tokens(again), _all_tokens(first))
    (line,) = _lines(caplog)
    assert line.startswith(f"token cache entry {first.tokens.file} ") and line.endswith(": made again")
    assert load_text(config(corpus), 16, cache_dir=cache).reused


def test_another_entrys_tokens_and_record_under_this_name_are_not_used(tmp_path, corpus, cache, caplog):
    other = tmp_path / "other.txt"
    other.write_text(prose(1), encoding="utf-8")
    mine = load_text(config(corpus), 16, cache_dir=cache)
    theirs = load_text(config(other), 16, cache_dir=cache)
    expected = _all_tokens(mine).copy()
    shutil.copy(theirs.tokens.file, mine.tokens.file)
    shutil.copy(theirs.tokens.file.with_suffix(".json"), mine.tokens.file.with_suffix(".json"))
    with caplog.at_level(logging.WARNING, logger="unitrain"):
        again = load_text(config(corpus), 16, cache_dir=cache)
    assert not again.reused and np.array_equal(_all_tokens(again), expected)
    assert "another entry's" in _lines(caplog)[0]


# ---------------------------------------------------------------------------------------------
# The BPE cache


def _bpe_entry(cache: Path) -> Path:
    (entry,) = [p for p in cache.glob("bpe-*.json") if not p.name.endswith(".record.json")]
    return entry


@pytest.mark.parametrize("copied", ["tokenizer", "tokenizer and record"])
def test_another_corpus_bpe_entry_of_300_tokens_is_not_used_for_256(tmp_path, corpus, cache, caplog, copied):
    other = tmp_path / "other.txt"
    other.write_text(prose(1), encoding="utf-8")
    mine = load_text(config(corpus, tokenizer="bpe", vocab_size=256), 16, cache_dir=cache)
    mine_entry = _bpe_entry(cache)
    theirs_cache = tmp_path / "theirs"
    load_text(config(other, tokenizer="bpe", vocab_size=300), 16, cache_dir=theirs_cache)
    theirs_entry = _bpe_entry(theirs_cache)
    shutil.copy(theirs_entry, mine_entry)
    if copied == "tokenizer and record":
        shutil.copy(job_tokenizer.bpe_record_path(theirs_entry), job_tokenizer.bpe_record_path(mine_entry))
    with caplog.at_level(logging.WARNING, logger="unitrain"):
        again = load_text(config(corpus, tokenizer="bpe", vocab_size=256), 16, cache_dir=cache)
    assert again.vocab_size == 256 and again.tokenizer.sha256 == mine.tokenizer.sha256
    assert np.array_equal(_all_tokens(again), _all_tokens(mine))
    (line,) = _lines(caplog)
    assert line.startswith(f"BPE cache entry {mine_entry} was damaged (") and line.endswith(": trained again")


@pytest.mark.parametrize("damage", ["truncated", "record deleted"])
def test_a_damaged_bpe_entry_is_trained_again_not_named_as_a_tokenizer_key(corpus, cache, caplog, monkeypatch, damage):
    cfg = config(corpus, tokenizer="bpe", vocab_size=280)
    first = load_text(cfg, 16, cache_dir=cache)
    entry = _bpe_entry(cache)
    if damage == "truncated":
        entry.write_text(entry.read_text()[:500])
    else:
        job_tokenizer.bpe_record_path(entry).unlink()
    with caplog.at_level(logging.WARNING, logger="unitrain"):
        again = load_text(cfg, 16, cache_dir=cache)  # no ConfigError naming tokenizer=<cache>/bpe-...
    assert again.tokenizer.sha256 == first.tokenizer.sha256 and again.reused  # the same tokens, still cached
    (line,) = _lines(caplog)
    assert line.startswith(f"BPE cache entry {entry} ") and line.endswith(": trained again")
    monkeypatch.setattr(job_tokenizer, "train_bpe", lambda *a: pytest.fail("trained again"))
    load_text(cfg, 16, cache_dir=cache)  # whole again: the next job reads it


# ---------------------------------------------------------------------------------------------
# What killed jobs left


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()  # a pid that ran once and runs no more
    return done.pid


def test_leftovers_of_dead_jobs_go_and_a_live_jobs_stay(corpus, cache):
    cache.mkdir()
    entry = "0123456789abcdef.tokens"
    live = records.temporary(cache / entry)  # this process's own name for it
    host = live.name.rsplit("@", 1)[1].removesuffix(".tmp")
    dead = _dead_pid()
    old = time.time() - 2 * records.UNQUALIFIED_GRACE_S
    left = {
        "dead, this host": (cache / f".{entry}.{dead}@{host}.tmp", None, False),
        "live, this host": (live, None, True),
        "dead, no host, old": (cache / f".{entry}.{dead}.tmp", old, False),
        "dead, no host, just written": (cache / f".bpe-x.json.{dead}.tmp", None, True),
        "live, no host, old": (cache / f".{entry}.{os.getpid()}.tmp", old, True),
        "another host, today": (cache / f".{entry}.{dead}@elsewhere.example.tmp", None, True),
        "another host, a day old": (cache / f".x.json.{dead}@elsewhere.tmp", time.time() - 2 * 86400, False),
        "not a temporary": (cache / ".notes", old, True),
    }
    for path, mtime, _ in left.values():
        path.write_bytes(b"\0" * 1000)
        if mtime is not None:
            os.utime(path, (mtime, mtime))
    loaded = load_text(config(corpus), 16, cache_dir=cache)
    assert {what: path.exists() for what, (path, _, _) in left.items()} == {
        what: stays for what, (_, _, stays) in left.items()
    }
    assert not loaded.reused and loaded.tokens.file.is_file()
