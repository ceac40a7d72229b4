"""No translator writes PyTorch code from another framework's: the torch half is the user's own."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from unitrain.errors import ConfigError
from unitrain.interface.translate import FileTranslation

__all__ = ["SOURCE", "converter_version", "missing_names", "translate_file"]

SOURCE: Optional[str] = None
_ALLOWED = "an import path pkg.module:function of your PyTorch model (model.paddle=convert converts the other way)"


def converter_version() -> str:
    raise ConfigError("model.torch", "convert", _ALLOWED)


def translate_file(source: Path, out: Path) -> FileTranslation:
    raise ConfigError("model.torch", "convert", _ALLOWED)


def missing_names(code: str) -> List[str]:
    return []
