"""What a backend refuses of the config, checked before anything starts: what
``backends/<name>/validation.py`` provides, without importing its framework.

:func:`unitrain.config.validation.validate` calls it after the checks every backend shares; the
backend's distributed context calls :meth:`ValidationModule.check_all_reduce` again, for library
users who never validate a config.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from unitrain.config.schema import DistConfig
from unitrain.interface import modules


class ValidationModule(Protocol):
    def check(self, cfg: Any) -> None:
        """Raise ConfigError for a value the framework cannot honour (a UnitrainConfig)."""

    def check_all_reduce(self, dist: DistConfig) -> None:
        """Raise ConfigError for an all-reduce lever (bucket size, compression) the framework lacks."""


def validation_module(backend: str) -> ValidationModule:
    return cast(ValidationModule, modules.load(backend, "validation"))
