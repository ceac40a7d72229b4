"""Files written whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional


def replace_text(path: Path, text: str) -> None:
    """Write ``text`` beside ``path`` and rename it into place: an interrupted writer leaves the
    earlier file, never half of one (the process id keeps two writers' temporaries apart)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def cannot_write_beside(path: Path) -> Optional[str]:
    """None where ``path`` can be made (its parent is a folder this process can write in), else
    why not: what an --out of a new folder needs."""
    if not path.parent.is_dir():
        return f"{path.parent} is not a folder"
    why = cannot_create_in(path.parent)
    return f"{path.parent}: {why}" if why else None


def cannot_create_in(folder: Path) -> Optional[str]:
    """None where this process can make a folder in ``folder``, else why not, in the system's
    words: checked by making one (permissions alone do not say it for root, /proc or a
    read-only mount), before any work that would write there."""
    try:
        probe = tempfile.mkdtemp(prefix=".unitrain-probe-", dir=folder)
    except OSError as err:
        return err.strerror or str(err)
    os.rmdir(probe)
    return None
