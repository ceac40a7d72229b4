"""Export in paddle: ``paddle.jit.save`` inference programs and ONNX through paddle2onnx. A
language model's token ids keep their time axis dynamic when the example carries ``max_length``."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np
import paddle

from unitrain.errors import UnitrainError
from unitrain.host.console import captured_stdout

__all__ = ["CHECKED_WITH", "WRITERS", "save_native", "save_onnx"]

OPSET = 17
WRITERS = {"native": "paddle.jit.save", "onnx": "paddle2onnx"}
CHECKED_WITH = {"native": "paddle.inference predictor", "onnx": "onnxruntime"}
#: The files ``paddle.jit.save(layer, prefix)`` writes under PIR (Paddle 3.x).
_NATIVE_SUFFIXES = (".json", ".pdiparams")


def input_shape(example: np.ndarray, batch: Optional[int]) -> List[Optional[int]]:
    """The program's input shape: None for a dynamic axis. The batch unless ``batch`` fixes it;
    a language model's time axis too when the example says how long it may grow (``max_length``,
    unitrain.deploy.artifacts.TokenIds: the program then takes 1 to that many tokens)."""
    shape: List[Optional[int]] = [batch, *example.shape[1:]]
    if getattr(example, "max_length", None):
        shape[1] = None
    return shape


def _spec(example: np.ndarray, batch: Optional[int]):
    # A None batch dimension gives a program that accepts any batch size; the dtype is the
    # example's (float32 images, int64 token ids).
    return [paddle.static.InputSpec(input_shape(example, batch), example.dtype.name, "images")]


def save_native(model: paddle.nn.Layer, stem: Path, example: np.ndarray, batch: Optional[int]) -> List[Path]:
    """``<stem>.json`` and ``<stem>.pdiparams``: loadable by ``paddle.inference.create_predictor``
    and by ``paddle.jit.load``."""
    model.eval()
    with warnings.catch_warnings():
        # PIR's tracer on what a traced program has no use for: full_like's place (a language
        # model's causal mask), translated code's .contiguous() ("Tensor do not have 'place'
        # interface for pir graph mode"); unitrain prints one line per artifact instead.
        warnings.filterwarnings("ignore", message="Tensor do not have '.*' interface", category=UserWarning)
        paddle.jit.save(model, str(stem), input_spec=_spec(example, batch))
    files = [stem.with_name(stem.name + s) for s in _NATIVE_SUFFIXES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise UnitrainError(
            f"paddle.jit.save did not write {', '.join(missing)} (this Paddle writes "
            f"{sorted(p.name for p in stem.parent.iterdir())})"
        )
    return files


def save_onnx(model: paddle.nn.Layer, stem: Path, example: np.ndarray, batch: Optional[int]) -> List[Path]:
    """``<stem>.onnx`` through paddle2onnx, from a ``jit.save`` program in a temporary directory."""
    return onnx_from_program(lambda prefix: save_native(model, prefix, example, batch), stem)


def onnx_from_program(save: Callable[[Path], List[Path]], stem: Path) -> List[Path]:
    """``<stem>.onnx`` through paddle2onnx, from the program ``save(prefix)`` writes (with
    ``jit.save``) into a temporary directory."""
    try:
        import paddle2onnx
    except ImportError:
        raise UnitrainError(
            "ONNX export from paddle needs paddle2onnx, which is not installed; install it with: pip install "
            "'unitrain[export]'"
        ) from None
    path = stem.with_name(stem.name + ".onnx")
    with tempfile.TemporaryDirectory(dir=stem.parent, prefix=".paddle2onnx-") as tmp:
        program, params = save(Path(tmp) / "model")
        # save_file=None returns the bytes: paddle2onnx logs a failed conversion instead of
        # raising, so unitrain checks what came back and writes the file itself. optimize_tool
        # "none": its default (Polygraphy) pip-installs a package at run time; ONNX Runtime
        # folds constants itself when it loads the model.
        # paddle2onnx's C++ side prints its progress to file descriptor 1: kept for the error
        # message instead of mixing it into unitrain's one line per artifact.
        with captured_stdout() as said:
            try:
                onnx_bytes = paddle2onnx.export(
                    str(program),
                    str(params),
                    save_file=None,
                    opset_version=OPSET,
                    enable_onnx_checker=True,
                    optimize_tool="none",
                )
            except Exception:  # noqa: BLE001 - reported below with what paddle2onnx printed
                onnx_bytes = None
    if not isinstance(onnx_bytes, bytes) or not onnx_bytes:
        last = [line for line in said().splitlines() if line.strip()][-1:] or ["(it printed nothing)"]
        raise UnitrainError(f"paddle2onnx could not convert the model: {last[0].strip()}")
    path.write_bytes(onnx_bytes)
    return [path]
