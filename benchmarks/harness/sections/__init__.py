"""The harness's sections, one module each, by the names --sections takes."""

from __future__ import annotations

from typing import Dict, Type

from ..settings import SECTIONS
from .amp import Amp
from .base import Section
from .compression import Compression
from .data import Data
from .loop import Loop
from .maxbatch import MaxBatch
from .overhead import Overhead
from .scaling import Scaling
from .tuned import Tuned

BY_NAME: Dict[str, Type[Section]] = {
    "overhead": Overhead,
    "loop": Loop,
    "data": Data,
    "scaling": Scaling,
    "compression": Compression,
    "tuned": Tuned,
    "maxbatch": MaxBatch,
    "amp": Amp,
}
assert tuple(BY_NAME) == SECTIONS, "settings.SECTIONS names every section, in the order a full run measures them"
