"""Where unitrain keeps what it can make again but would rather not: converted model code,
tokenized corpora. One rule for all of them, so that one variable moves the lot."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """UNITRAIN_CACHE, else $XDG_CACHE_HOME/unitrain, else ~/.cache/unitrain."""
    if os.environ.get("UNITRAIN_CACHE"):
        return Path(os.environ["UNITRAIN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "unitrain"
