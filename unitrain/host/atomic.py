"""Files written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path


def replace_text(path: Path, text: str) -> None:
    """Write ``text`` beside ``path`` and rename it into place: an interrupted writer leaves the
    earlier file, never half of one (the process id keeps two writers' temporaries apart)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
