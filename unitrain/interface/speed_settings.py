"""Each framework at its best: ``backend.tuned=true`` applies the speed settings a framework's
own documentation recommends for the device, on top of the job's common settings.

A comparison has two readings: the same settings on both frameworks (the default, and the
only mode ``unitrain.parity`` accepts), and each framework tuned as its authors advise. The
report labels every row with its reading and never ranks a tuned row against an untuned one.

The base class is the "same settings" reading: every method is a no-op. A backend's
``speed_settings.py`` subclasses it (``Tuned``) and overrides only what it applies, and records what it *observed*
ran (a compiled graph, a memory format, a static program), not what was asked for.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, Sequence, Type, cast

from unitrain.errors import ConfigError
from unitrain.interface import modules

SAME_SETTINGS, TUNED = "same settings", "tuned"


class SpeedSettings:
    """Same settings: the model, inputs and loop exactly as the job describes them.

    A subclass lists the settings it can apply in ``SETTINGS`` (name: what it is), the ones its
    framework documents but that unitrain does not offer in ``not_offered(device)``, and in
    ``left_out(device)`` the ones it leaves out by default on a device; each with the reason.
    """

    settings = SAME_SETTINGS
    SETTINGS: Dict[str, str] = {}

    def __init__(self, device: str = "cpu", chosen: Optional[Sequence[str]] = None):
        self.device = device
        unknown = [name for name in chosen or () if name not in self.SETTINGS]
        if unknown:
            raise ConfigError(
                "backend.tuned_settings",
                list(chosen),
                f"names from {', '.join(self.SETTINGS) or 'nothing (no settings)'}, or null for the defaults",
            )
        # Settings the framework documents for this device but that were left out, and why.
        self.skipped: Dict[str, str] = {**self.not_offered(device), **(self.left_out(device) if chosen is None else {})}
        self.chosen = [name for name in (chosen if chosen is not None else self.SETTINGS) if name not in self.skipped]

    @staticmethod
    def not_offered(device: str) -> Dict[str, str]:
        return {}

    @staticmethod
    def left_out(device: str) -> Dict[str, str]:
        return {}

    def prepare_model(self, model: Any) -> Any:
        """Applied to the raw model before the optimizer sees its parameters (memory format)."""
        return model

    def wrap_model(self, model: Any) -> Any:
        """Applied to the model the loop trains with, after data-parallel wrapping (compilers).
        Evaluation and checkpoints keep using the raw model."""
        return model

    def convert_input(self, images: Any) -> Any:
        return images

    def observed(self) -> List[str]:
        """What the framework reports it did, read back after training."""
        return []

    def describe(self) -> Dict[str, Any]:
        return {"settings": self.settings, "applied": self.observed(), "skipped": dict(self.skipped)}


class SpeedSettingsModule(Protocol):
    #: The framework's own speed settings (``backend.tuned=true``).
    Tuned: Type[SpeedSettings]


def speed_settings_module(backend: str) -> SpeedSettingsModule:
    return cast(SpeedSettingsModule, modules.load(backend, "speed_settings"))


def make_speed_settings(
    backend: str, tuned: bool, device: str, chosen: Optional[Sequence[str]] = None
) -> SpeedSettings:
    if not tuned:
        if chosen is not None:
            raise ConfigError("backend.tuned_settings", list(chosen), "null unless backend.tuned=true")
        return SpeedSettings(device)
    return speed_settings_module(backend).Tuned(device, chosen)
