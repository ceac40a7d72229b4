"""ONNX Runtime's quantization tool on an fp32 ONNX file: the framework-neutral int8 path that
every ``python -m unitrain.quantize`` run sets beside the framework's own."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import List

import numpy as np

from unitrain.errors import UnitrainError


def quantize_onnx(source: Path, target: Path, method: str, calibration: List[np.ndarray], per_channel: bool, reduce_range: bool) -> Path:
    try:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError:
        raise UnitrainError("quantizing ONNX models needs onnxruntime, which is not installed; install it with: pip install 'unitrain[export]'") from None
    # ONNX Runtime's tool logs every tensor it leaves alone at INFO, some of it on the root
    # logger, which Hydra prints: quiet for the duration.
    root, quiet = logging.getLogger(), logging.getLogger("onnxruntime")
    levels = root.level, quiet.level
    root.setLevel(logging.WARNING)
    quiet.setLevel(logging.WARNING)
    # ONNX Runtime's advice: shape inference and graph optimization before quantization.
    prepared = target.with_name(target.stem + ".pre.onnx")
    try:
        quant_pre_process(str(source), str(prepared))
        if method == "dynamic":
            quantize_dynamic(str(prepared), str(target), per_channel=per_channel, reduce_range=reduce_range, weight_type=QuantType.QInt8)
        else:
            name = "images"

            class Batches(CalibrationDataReader):
                def __init__(self):
                    self.left = iter(calibration)

                def get_next(self):
                    batch = next(self.left, None)
                    return None if batch is None else {name: batch}

            # QDQ with per-channel int8 weights and uint8 activations, the format ONNX Runtime
            # fuses into QLinearConv on x86.
            quantize_static(
                str(prepared), str(target), Batches(), quant_format=QuantFormat.QDQ, per_channel=per_channel, reduce_range=reduce_range,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
            )  # fmt: skip
    finally:
        prepared.unlink(missing_ok=True)
        root.setLevel(levels[0])
        quiet.setLevel(levels[1])
    return target
