"""Where each backend lives, and its modules loaded by name.

A backend is a package ``unitrain.backends.<name>`` whose modules carry the names of the
modules of :mod:`unitrain.interface`, each providing what the same-named interface module's
Protocol lists. Most of them import their framework; ``launch``, ``translate``, ``validation`` and ``weights``
do not, so that the main process can start a job, check its config and convert weights
without loading paddle or torch.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Dict, List

from unitrain.errors import BackendUnavailableError, UnknownNameError
from unitrain.host.console import printed_to_log_file


@dataclass(frozen=True)
class _Entry:
    package: str  # the backend's package
    framework: str  # the framework's top-level module
    extra: str  # the pip extra that installs it


_BACKENDS: Dict[str, _Entry] = {
    "paddle": _Entry(package="unitrain.backends.paddle", framework="paddle", extra="paddle"),
    "torch": _Entry(package="unitrain.backends.torch", framework="torch", extra="torch"),
}


def available_backends() -> List[str]:
    """Every backend unitrain knows, installed or not."""
    return sorted(_BACKENDS)


def module_path(backend: str, module: str) -> str:
    """``unitrain.backends.<backend>.<module>``, for a child process to import."""
    if backend not in _BACKENDS:
        raise UnknownNameError("backend", backend, _BACKENDS)
    return f"{_BACKENDS[backend].package}.{module}"


def load(backend: str, module: str) -> ModuleType:
    """The backend's module of that name; a framework that is not installed is one line naming
    the extra that installs it. The warnings the backend package lists in ``QUIET_ON_IMPORT``
    are silenced while it loads, the lines it lists in ``PRINTED_ON_IMPORT`` go to the log file."""
    path = module_path(backend, module)
    entry = _BACKENDS[backend]
    try:
        package = importlib.import_module(entry.package)
        quiet = getattr(package, "QUIET_ON_IMPORT", ())
        with warnings.catch_warnings(), printed_to_log_file(getattr(package, "PRINTED_ON_IMPORT", ())):
            for message in quiet:
                warnings.filterwarnings("ignore", message=message)
            return importlib.import_module(path)
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] == entry.framework:
            raise BackendUnavailableError(
                f"backend {backend!r} needs the {entry.framework!r} framework, which is not installed; "
                f"install it with: pip install 'unitrain[{entry.extra}]'"
            ) from None
        raise
