"""What data=text keeps as JSON: a record (a frozen dataclass's fields) read back only when
whole, and the keys of its cache's entries."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Optional, Type, TypeVar

#: Bumped whenever what a cache entry holds would change for the same corpus and tokenizer.
CACHE_FORMAT = 1

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


def cache_key(*parts: Any) -> str:
    """A cache entry's name: the hash of CACHE_FORMAT and ``parts`` (what its content depends on)."""
    return hashlib.sha256(json.dumps([CACHE_FORMAT, *parts]).encode("utf-8")).hexdigest()[:32]
