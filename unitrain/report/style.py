"""How every plot tells the frameworks apart: one colour and one marker each, whichever plot."""

from __future__ import annotations

from typing import Dict

from unitrain.interface.modules import available_backends

_COLORS = (("#2932e1", "blue"), ("#ee4c2c", "red"))
_MARKERS = ("s", "o")


def colors() -> Dict[str, str]:
    return {name: color for name, (color, _) in zip(available_backends(), _COLORS)}


def color_legend() -> str:
    """``paddle blue, torch red``: the colours in words, for a plot's title."""
    return ", ".join(f"{name} {word}" for name, (_, word) in zip(available_backends(), _COLORS))


def markers() -> Dict[str, str]:
    return dict(zip(available_backends(), _MARKERS))
