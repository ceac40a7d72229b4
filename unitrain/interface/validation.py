"""What a backend refuses of the config, checked before anything starts: what
``backends/<name>/validation.py`` provides, without importing its framework.

Each kind of job (:mod:`unitrain.jobs`) calls its own check after the rules every backend
shares; the backend's distributed context calls :meth:`ValidationModule.check_all_reduce` again,
for library users who never validate a config.
"""

from __future__ import annotations

from typing import Protocol, cast

from unitrain.config.schema import DistConfig, UnitrainConfig
from unitrain.interface import modules


class ValidationModule(Protocol):
    def check_collective(self, cfg: UnitrainConfig) -> None:
        """Raise ConfigError for a value the framework cannot honour in a collective job (one
        process or data parallel)."""

    def check_ps(self, cfg: UnitrainConfig) -> None:
        """Raise ConfigError for a value the framework cannot honour in a parameter-server job."""

    def check_all_reduce(self, dist: DistConfig) -> None:
        """Raise ConfigError for an all-reduce lever (bucket size, compression) the framework lacks."""


def validation_module(backend: str) -> ValidationModule:
    return cast(ValidationModule, modules.load(backend, "validation"))
