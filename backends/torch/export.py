"""Export in torch: ``torch.export`` ExportedPrograms (.pt2) and ONNX through ``torch.onnx.export``
(read back by the runtimes in ``infer.py``). A language model's token ids keep their time axis
dynamic (1 to its context length) when the example carries ``max_length``."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from unitrain.errors import UnitrainError

__all__ = ["CHECKED_WITH", "WRITERS", "save_native", "save_onnx"]

# The ONNX exporter's default (dynamo) path; the legacy TorchScript path is deprecated.
OPSET = 18
WRITERS = {"native": "torch.export", "onnx": "torch.onnx.export"}
CHECKED_WITH = {"native": "torch.export.load", "onnx": "onnxruntime"}


def dynamic_axes(example: np.ndarray, batch: Optional[int]) -> Dict[int, Any]:
    """The example's dynamic axes: the batch unless ``batch`` fixes it, and a language model's
    time axis when the example says how long it may grow (``max_length``: token ids whose
    example holds the full context; unitrain.tasks.language_export.TokenIds)."""
    axes: Dict[int, Any] = {} if batch is not None else {0: torch.export.Dim("batch", min=1, max=65536)}
    max_length = getattr(example, "max_length", None)
    if max_length:
        axes[1] = torch.export.Dim("time", min=1, max=int(max_length))
    return axes


def _example_and_shapes(example: np.ndarray, batch: Optional[int]):
    x = torch.from_numpy(np.ascontiguousarray(example))
    # batch None: a dynamic batch dimension; an int: the program is specialised to that batch.
    axes = dynamic_axes(example, batch)
    return x, ((axes,) if axes else None)


def save_native(model: torch.nn.Module, stem: Path, example: np.ndarray, batch: Optional[int]) -> List[Path]:
    """``<stem>.pt2``: an ExportedProgram, loadable with ``torch.export.load`` alone."""
    x, shapes = _example_and_shapes(example, batch)
    program = torch.export.export(model.eval(), (x,), dynamic_shapes=shapes)
    path = stem.with_name(stem.name + ".pt2")
    torch.export.save(program, path)
    return [path]


def save_onnx(model: torch.nn.Module, stem: Path, example: np.ndarray, batch: Optional[int]) -> List[Path]:
    """``<stem>.onnx``, weights inside (no external data file), input ``images``, output ``logits``."""
    x, shapes = _example_and_shapes(example, batch)
    path = stem.with_name(stem.name + ".onnx")
    onnx_export(model, (x,), path, ["images"], ["logits"], shapes)
    return [path]


def onnx_export(
    model: torch.nn.Module, inputs: tuple, path: Path, names: List[str], outputs: List[str], shapes
) -> None:
    """torch.onnx.export (the dynamo exporter) into one file, quietly."""
    # Progress at INFO, and a warning per torchvision operator it cannot register (unitrain uses none).
    quiet = logging.getLogger("onnxscript"), logging.getLogger("onnx_ir"), logging.getLogger("torch.onnx")
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        # The exporter prints its progress to stdout; unitrain prints one line per artifact instead.
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            # Two inputs sharing the batch axis: it says it will name the axis once.
            warnings.simplefilter("ignore", UserWarning)
            torch.onnx.export(
                model.eval(),
                inputs,
                str(path),
                input_names=names,
                output_names=outputs,
                opset_version=OPSET,
                dynamic_shapes=shapes,
                external_data=False,
                dynamo=True,
            )
    except ImportError as err:
        raise UnitrainError(
            f"ONNX export from torch needs {err.name or 'onnxscript'}, which is not installed; install it with: pip "
            "install 'unitrain[export]'"
        ) from None
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
