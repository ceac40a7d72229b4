"""Where unitrain keeps what it can make again but would rather not: converted model code,
tokenized corpora. One rule for all of them, so that one variable moves the lot."""

from __future__ import annotations

import os
from pathlib import Path

from unitrain.errors import ConfigError
from unitrain.host.atomic import cannot_create_in


def cache_root() -> Path:
    """UNITRAIN_CACHE, else $XDG_CACHE_HOME/unitrain, else ~/.cache/unitrain."""
    if os.environ.get("UNITRAIN_CACHE"):
        return Path(os.environ["UNITRAIN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "unitrain"


def cache_dir(part: str) -> Path:
    """``cache_root()/part``, made where missing; where it cannot be (UNITRAIN_CACHE a file, a
    folder this user cannot write, under /proc), one line before anything is written."""
    path = cache_root() / part
    why = None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        why = err.strerror or str(err)
    why = why or cannot_create_in(path)
    if why:
        raise ConfigError(
            "UNITRAIN_CACHE",
            os.environ.get("UNITRAIN_CACHE") or str(cache_root()),
            f"{path}: {why}; allowed: a folder this user can write (unset: $XDG_CACHE_HOME/unitrain or "
            "~/.cache/unitrain)",
        )
    return path
