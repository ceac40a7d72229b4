"""ONNX Runtime's quantization tool on an fp32 ONNX file: the framework-neutral int8 path that
every ``python -m unitrain.quantize`` run sets beside the framework's own."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import numpy as np

from unitrain.errors import UnitrainError


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """ONNX Runtime's tool logs every tensor it leaves alone at INFO, some of it on the root
    logger, which Hydra prints, and the sessions its pre-processing opens warn of every unused
    initializer a converter left: quiet for the duration."""
    import onnxruntime

    loggers = logging.getLogger(), logging.getLogger("onnxruntime")
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    onnxruntime.set_default_logger_severity(3)
    try:
        yield
    finally:
        onnxruntime.set_default_logger_severity(2)  # ONNX Runtime's default: warnings
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _pre_process(quant_pre_process: Callable[..., None], source: Path, prepared: Path) -> None:
    """ONNX Runtime's symbolic shape inference, or ONNX's own where it stops short (paddle2onnx's
    reshapes that copy a dimension, as in a Vision Transformer's attention; the attention of
    torch's ONNX of a language model). Where it stops short it leaves the model it got to as
    ``sym_shape_infer_temp.onnx`` in the working directory: it runs from a temporary one."""
    source, prepared = source.resolve(), prepared.resolve()
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="unitrain-ort-shapes-") as tmp:
        os.chdir(tmp)
        try:
            quant_pre_process(str(source), str(prepared))
        except Exception:  # noqa: BLE001 - it raises a bare Exception("Incomplete symbolic shape inference")
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        finally:
            os.chdir(here)


def quantize_onnx(
    source: Path, target: Path, method: str, calibration: List[np.ndarray], per_channel: bool, reduce_range: bool
) -> Path:
    try:
        from onnxruntime.quantization import (
            CalibrationDataReader,
            QuantFormat,
            QuantType,
            quantize_dynamic,
            quantize_static,
        )
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError:
        raise UnitrainError(
            "quantizing ONNX models needs onnxruntime, which is not installed; install it with: pip install "
            "'unitrain[export]'"
        ) from None

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(calibration)

        def get_next(self) -> Optional[Dict[str, np.ndarray]]:
            batch = next(self.left, None)
            return None if batch is None else {"images": np.asarray(batch)}  # a plain array, whatever its class

    # ONNX Runtime's advice: shape inference and graph optimization before quantization.
    prepared = target.with_name(target.stem + ".pre.onnx")
    try:
        with _quiet():
            _pre_process(quant_pre_process, source, prepared)
            weights = {"per_channel": per_channel, "reduce_range": reduce_range, "weight_type": QuantType.QInt8}
            if method == "dynamic":
                quantize_dynamic(str(prepared), str(target), **weights)
            else:
                # QDQ with per-channel int8 weights and uint8 activations, the format ONNX Runtime
                # fuses into QLinearConv on x86.
                quantize_static(
                    str(prepared),
                    str(target),
                    Batches(),
                    quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8,
                    **weights,
                )
    finally:
        prepared.unlink(missing_ok=True)
    return target
