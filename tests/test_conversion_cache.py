"""The conversion cache (model.paddle=convert) heals: an entry edited, truncated or emptied since
it was written is converted again with a line that says so; what killed conversions left is
cleaned after a day; a cache that cannot be written is one line."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time

import pytest

from unitrain.errors import ConfigError
from unitrain.model.translate import CONTENTS, REPORT, find_source, translate

NET = """import torch.nn as nn


def build(num_classes, image_size):
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * image_size * image_size, num_classes))
"""


@pytest.fixture
def user(tmp_path, monkeypatch):
    """A user's folder with one model file, and a cache of its own."""
    (tmp_path / "tiny_net.py").write_text(NET)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("UNITRAIN_CACHE", str(tmp_path / "cache"))
    _forget_converted()
    yield tmp_path
    _forget_converted()


def _forget_converted() -> None:
    """Each test imports its own cache's tree (the translated package's name is the same in all)."""
    for name in [n for n in sys.modules if n.startswith("unitrain_converted_")]:
        del sys.modules[name]


def _translate():
    return translate(find_source("model.torch", "tiny_net:build"), "paddle")


def _builds(translation) -> None:
    _forget_converted()
    model = translation.factory()(num_classes=3, image_size=4)
    assert sum(1 for _ in model.parameters()) == 2


@pytest.mark.parametrize("damage", ["edited", "truncated report", "deleted", "no contents"])
def test_a_damaged_entry_is_converted_again_and_said(user, caplog, damage):
    first = _translate()
    code = next(first.directory.rglob("tiny_net.py"))
    if damage == "edited":
        code.write_text(code.read_text().replace("Linear", "Identity"))
    elif damage == "truncated report":
        (first.directory / REPORT).write_text('{"conv')
    elif damage == "deleted":
        code.unlink()
    else:
        (first.directory / CONTENTS).unlink()
    with caplog.at_level(logging.WARNING, logger="unitrain"):
        again = _translate()
    said = [r.getMessage() for r in caplog.records if "the cached conversion" in r.getMessage()]
    assert len(said) == 1 and "converting tiny_net again" in said[0] and "\n" not in said[0]
    assert (
        again.directory == first.directory and "Identity" not in next(again.directory.rglob("tiny_net.py")).read_text()
    )
    _builds(again)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="unitrain"):
        _translate()  # healed: used as it is
    assert not caplog.records


def test_an_imported_entry_still_verifies(user, caplog, monkeypatch):
    """Importing the translated code writes __pycache__ into the entry: not a change of it."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    _builds(_translate())
    assert list(user.joinpath("cache").rglob("__pycache__"))
    with caplog.at_level(logging.WARNING, logger="unitrain"):
        _translate()
    assert not caplog.records


def test_what_killed_conversions_left_goes_after_a_day(user):
    root = _translate().directory.parent
    old, young = root / ".converting-old", root / ".converting-young"
    for folder in (old, young):
        folder.mkdir()
        (folder / "half.py").write_text("x = ")
    day_ago = time.time() - 2 * 86400
    os.utime(old, (day_ago, day_ago))
    shutil.rmtree(next(root.glob("*[0-9a-f]")))  # the next job converts: and cleans
    _translate()
    assert not old.exists() and young.exists()


@pytest.mark.parametrize("where", ["a file", "/proc"])
def test_a_cache_that_cannot_be_written_is_one_line(user, monkeypatch, where):
    if where == "a file":
        (user / "cache-file").write_text("")
        monkeypatch.setenv("UNITRAIN_CACHE", str(user / "cache-file"))
    else:
        monkeypatch.setenv("UNITRAIN_CACHE", "/proc/unitrain-cache")
    with pytest.raises(ConfigError) as err:
        _translate()
    message = str(err.value)
    assert message.startswith("UNITRAIN_CACHE=") and "a folder this user can write" in message
    assert "\n" not in message
