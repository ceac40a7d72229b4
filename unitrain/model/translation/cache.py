"""The conversion cache's entries (``model.<backend>=convert``): the key a translated tree is
cached under (the sources, the converter, unitrain's substitutions), what an entry held when it
was written (:data:`CONTENTS`, checked before it is used), a damaged entry put aside, and what
killed conversions left behind."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Optional

from unitrain.host.machine import unitrain_version
from unitrain.model.translation.source import Source

#: {file: sha256} of a cached tree, written last: an entry is used only as it was written.
CONTENTS = "contents.json"


def digest(source: Source, converter: str, module: Any) -> str:
    """The cache key: the sources, the converter, and unitrain's substitutions (the code of the
    translate module's backend, its sub-packages too: a bridge added since a tree was cached
    changes what it runs)."""
    hashed = hashlib.sha256(f"{converter}\n{unitrain_version()}\n".encode())
    for own in sorted(Path(module.__file__).parent.rglob("*.py")):
        hashed.update(own.read_bytes())
    for rel in source.files:
        hashed.update(f"{rel}\n".encode())
        hashed.update((source.root / rel).read_bytes())
    return hashed.hexdigest()[:16]


def contents(directory: Path) -> Dict[str, str]:
    """{file: sha256} of a translated tree, what Python writes when it imports it left out."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != CONTENTS and "__pycache__" not in p.parts
    }


def damaged(directory: Path) -> Optional[str]:
    """None where a cached tree holds what was written, else what is not so (a file edited,
    truncated or deleted since: it would be imported as the conversion)."""
    try:
        written = json.loads((directory / CONTENTS).read_text())
    except (OSError, ValueError):
        return f"has no readable {CONTENTS} (unfinished, or written before entries were verified)"
    found = contents(directory)
    for name, digest in written.items():
        if name not in found:
            return f"lost {name}"
        if found[name] != digest:
            return f"holds {name} changed since it was written"
    return None


def discard(directory: Path) -> None:
    """A damaged entry out of the way (renamed first: another process may be reading the name)."""
    stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=directory.parent))
    try:
        directory.rename(stale / directory.name)
    except OSError:  # another process moved it first
        pass
    shutil.rmtree(stale, ignore_errors=True)


def clean_leftovers(root: Path, older_than_s: float = 86400) -> None:
    """What killed conversions left (``.converting-*``, ``.stale-*``), once nothing can still be
    writing it: older than a day."""
    now = time.time()
    for path in [*root.glob(".converting-*"), *root.glob(".stale-*")]:
        try:
            if now - path.stat().st_mtime > older_than_s:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue
