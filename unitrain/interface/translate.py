"""Code translation: what ``backends/<name>/translate.py`` provides to write that framework's half
of a user's model from the other framework's code (``model.<name>=convert``).

A backend that can translate names the framework whose code it reads (``SOURCE``); one that cannot
refuses in one line. Neither imports its framework until it checks the names the translated code
uses, so the main process can translate and refuse before a job starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Protocol, cast

from unitrain.interface import modules


@dataclass(frozen=True, kw_only=True)
class Unconverted:
    """A call the converter left as it was."""

    api: str
    file: str
    line: int


@dataclass(frozen=True, kw_only=True)
class FileTranslation:
    """One source file's conversion."""

    converted: int  # API uses converted
    unconverted: List[Unconverted]
    #: What the backend put in place of the converter's output, and how many times.
    substituted: dict


class TranslateModule(Protocol):
    #: The backend whose code converts into this one's; None where no converter writes this framework.
    SOURCE: Optional[str]

    def converter_version(self) -> str:
        """The converter's name and version (part of the cache key)."""

    def translate_file(self, source: Path, out: Path) -> FileTranslation:
        """``source`` converted into ``out``, with the backend's substitutions applied."""

    def missing_names(self, code: str) -> List[str]:
        """Names the converted ``code`` uses that the installed framework does not have."""


def translate_module(backend: str) -> TranslateModule:
    return cast(TranslateModule, modules.load(backend, "translate"))
