"""What data=text keeps as JSON, and what its cache holds: a record (a frozen dataclass's fields)
read back only when whole; the cache's keys; a cache entry's record sealed with its own digest and
written last, the digest of the file it describes; and what killed jobs left in the cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Type, TypeVar

from unitrain.host.processes import running

#: Bumped whenever what a cache entry holds would change for the same corpus and tokenizer.
CACHE_FORMAT = 1
#: A cache entry's record holds, under this name, the sha256 of its other fields: a record
#: edited or cut short since it was written is not trusted.
SEAL = "record_sha256"
#: Bytes hashed at a time.
DIGEST_CHUNK = 1 << 22
#: A temporary file named by its writer's pid alone (host.atomic's, or an older unitrain's) is
#: removed once that pid is gone and the file is this old: its writer may run on another host
#: that shares the cache, and writes it in well under this time.
UNQUALIFIED_GRACE_S = 60.0
#: A temporary file another host's job is writing is removed once this old (it cannot be asked).
OTHER_HOST_GRACE_S = 86400.0

R = TypeVar("R", bound="JsonRecord")


class JsonRecord:
    """A frozen dataclass kept as a JSON file of its fields (the tokenizer's corpus record, a
    token cache entry's record)."""

    @classmethod
    def read_json(cls: Type[R], path: Path, /, **given: Any) -> Optional[R]:
        """The record the file ``path`` holds, with ``given`` (the fields it leaves out); None
        where the file is missing, unreadable or not such a record."""
        try:
            return cls(**given, **json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return None

    def json_text(self, *left_out: str) -> str:
        """The record's fields but ``left_out`` as the file's text."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k not in left_out}
        return json.dumps(fields, indent=1) + "\n"

    def sealed_text(self, *left_out: str) -> str:
        """As :meth:`json_text`, sealed (:data:`SEAL`): a cache entry's record."""
        return sealed_text({k: v for k, v in dataclasses.asdict(self).items() if k not in left_out})


def cache_key(*parts: Any) -> str:
    """A cache entry's name: the hash of CACHE_FORMAT and ``parts`` (what its content depends on)."""
    return hashlib.sha256(json.dumps([CACHE_FORMAT, *parts]).encode("utf-8")).hexdigest()[:32]


def _seal(fields: Dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode("utf-8")).hexdigest()


def sealed_text(fields: Dict[str, Any]) -> str:
    """``fields`` as a record's text, with their digest (:data:`SEAL`)."""
    return json.dumps({**fields, SEAL: _seal(fields)}, indent=1) + "\n"


def read_entry(data: Path, record: Path) -> Tuple[Optional[Dict[str, Any]], str]:
    """A cache entry's sealed record (:func:`read_sealed`), or None and "" where neither the
    entry's ``data`` file nor its ``record`` is there (nothing cached yet)."""
    if not data.exists() and not record.exists():
        return None, ""
    return read_sealed(record)


def read_sealed(path: Path) -> Tuple[Optional[Dict[str, Any]], str]:
    """A sealed record's fields and "", else None and what is wrong with the entry it describes,
    worded to follow "cache entry X" (``path`` missing, unreadable, unsealed or changed)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, "has no record (its job was killed before writing it, or an older unitrain wrote it)"
    except (OSError, UnicodeDecodeError) as err:
        return None, f"was damaged (its record {path.name} cannot be read: {err})"
    try:
        fields = json.loads(text)
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        return None, f"was damaged (its record {path.name} is not a JSON object: cut short?)"
    seal = fields.pop(SEAL, None)
    if seal is None:
        return None, "was written before cache entries were verified"
    if seal != _seal(fields):
        return None, f"was damaged (its record {path.name} changed since it was written)"
    return fields, ""


def file_digest(path: Path) -> str:
    """The sha256 of a file's content, read a few megabytes at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(DIGEST_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# What killed jobs left


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "localhost"


#: ``.<name>.<pid>[@<host>].tmp``: a file being written, by whom.
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)(?:@(?P<host>[A-Za-z0-9.-]+))?\.tmp$")


def temporary(path: Path) -> Path:
    """Where this process writes ``path`` before renaming it into place: hidden, named by its
    pid and host so that a later job can tell a killed writer's leftover (:func:`clean_leftovers`)."""
    return path.with_name(f".{path.name}.{os.getpid()}@{_host()}.tmp")


def clean_leftovers(folder: Path) -> int:
    """Remove from ``folder`` the temporary files (``.<name>.<pid>[@<host>].tmp``) of jobs that no
    longer run: this host's whose pid is gone; those without a host once their pid is gone and they
    are :data:`UNQUALIFIED_GRACE_S` old; another host's once a day old. A live job's stay. The
    bytes removed are returned."""
    removed, now, host = 0, time.time(), _host()
    try:
        names = [entry for entry in os.scandir(folder) if entry.name.startswith(".")]
    except OSError:  # not made yet
        return 0
    for entry in names:
        found = _TEMPORARY.match(entry.name)
        if found is None:
            continue
        try:
            stat = entry.stat(follow_symlinks=False)
            age = now - stat.st_mtime
            if found["host"] is None:
                gone = not running(int(found["pid"])) and age > UNQUALIFIED_GRACE_S
            elif found["host"] == host:
                gone = not running(int(found["pid"]))
            else:
                gone = age > OTHER_HOST_GRACE_S
            if gone:
                os.unlink(entry.path)
                removed += stat.st_size
        except OSError:  # another job removed it first
            continue
    return removed
