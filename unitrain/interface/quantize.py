"""Int8 models written by the framework's own quantization toolkit: what
``backends/<name>/quantize.py`` provides. The core (:mod:`unitrain.deploy.quantize`) chooses the
calibration data, runs quantization-aware training in the one training loop, and times every
artifact against the fp32 one."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, List, Mapping, Optional, Protocol, Sequence, Tuple, cast

import numpy as np

from unitrain.interface import modules

#: The files of each artifact written, and its fixed batch size (None: any).
Saved = List[Tuple[List[Path], Optional[int]]]


class QuantizeModule(Protocol):
    #: Per method, what writes the artifact (recorded in its manifest).
    QUANTIZER: Mapping[str, str]

    def check(self, method: str, per_channel: bool) -> None:
        """Refuse, in one line, what this toolkit cannot do or is not installed for."""

    def save_quantized(
        self,
        model: Any,
        method: str,
        calibration: Iterable[np.ndarray],
        stem: Path,
        reduce_range: bool,
        per_channel: bool,
        batches: Sequence[int],
    ) -> Saved:
        """Post-training quantization (``dynamic`` or ``static``) of a trained fp32 model."""

    def prepare_qat(self, model: Any, example: np.ndarray, reduce_range: bool) -> Any:
        """The model with fake quantization, trainable by the training loop."""

    def save_qat(self, prepared: Any, stem: Path, example: np.ndarray, batches: Sequence[int]) -> Saved:
        """The fine-tuned model of :meth:`prepare_qat`, converted to int8 and saved."""


def quantize_module(backend: str) -> QuantizeModule:
    return cast(QuantizeModule, modules.load(backend, "quantize"))
