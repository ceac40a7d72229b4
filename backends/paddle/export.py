"""Export in paddle: ``paddle.jit.save`` inference programs and ONNX through paddle2onnx. A
language model's token ids keep their time axis dynamic when the example carries ``max_length``."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np
import paddle

from unitrain.errors import UnitrainError

__all__ = ["CHECKED_WITH", "WRITERS", "save_native", "save_onnx"]

OPSET = 17
WRITERS = {"native": "paddle.jit.save", "onnx": "paddle2onnx"}
CHECKED_WITH = {"native": "paddle.inference predictor", "onnx": "onnxruntime"}
#: The files ``paddle.jit.save(layer, prefix)`` writes under PIR (Paddle 3.x).
_NATIVE_SUFFIXES = (".json", ".pdiparams")


def input_shape(example: np.ndarray, batch: Optional[int]) -> List[Optional[int]]:
    """The program's input shape: None for a dynamic axis. The batch unless ``batch`` fixes it;
    a language model's time axis too when the example says how long it may grow (``max_length``,
    unitrain.tasks.language_export.TokenIds: the program then takes 1 to that many tokens)."""
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
    ``jit.save``) into a temporary directory, removed whatever happens. paddle2onnx aborts its
    process on an operator it has no converter for (SIGABRT, "Due to the unsupported operators,
    the conversion is aborted", naming none): it runs in a child process, and a failure is one line
    naming the operators it lacks (:func:`unsupported_operators`)."""
    try:
        import paddle2onnx  # noqa: F401 - installed: the child imports it
    except ImportError:
        raise UnitrainError(
            "ONNX export from paddle needs paddle2onnx, which is not installed; install it with: pip install "
            "'unitrain[export]'"
        ) from None
    path = stem.with_name(stem.name + ".onnx")
    with tempfile.TemporaryDirectory(dir=stem.parent, prefix=".paddle2onnx-") as tmp:
        program, params = save(Path(tmp) / "model")
        written = Path(tmp) / "model.onnx"
        # paddle2onnx's C++ side prints its progress to file descriptor 1: kept for the error
        # message instead of mixing it into unitrain's one line per artifact.
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(program), str(params), str(written), str(OPSET)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
        )
        if done.returncode != 0 or not written.is_file() or not written.stat().st_size:
            raise UnitrainError(_failure(done, program))
        written.replace(path)
    return [path]


#: The child: save_file=None returns the bytes (paddle2onnx logs a failed conversion instead of
#: raising); optimize_tool "none": its default (Polygraphy) pip-installs a package at run time, and
#: ONNX Runtime folds constants itself when it loads the model.
_CHILD = """
import sys, paddle2onnx
program, params, out, opset = sys.argv[1:]
onnx_bytes = paddle2onnx.export(
    program, params, save_file=None, opset_version=int(opset), enable_onnx_checker=True, optimize_tool="none"
)
if not isinstance(onnx_bytes, bytes) or not onnx_bytes:
    sys.exit("paddle2onnx returned no model")
open(out, "wb").write(onnx_bytes)
"""
#: Operators of every program that are not computations (what feeds and fetches it).
_NOT_COMPUTED = {"data", "fetch", "feed"}


def _failure(done: subprocess.CompletedProcess, program: Path) -> str:
    """paddle2onnx's failure in one line: the operators it has no converter for, else the last
    line it printed."""
    missing = unsupported_operators(program)
    if missing:
        names = ", ".join(missing)
        return (
            f"paddle2onnx could not convert the model: it has no converter for the Paddle operator(s) {names} "
            "(what the model's code computes with)"
        )
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines()]
    said = [line for line in lines if "Paddle2ONNX]" in line and not line.endswith("]")]
    said = said or [line for line in lines if line] or ["(it printed nothing)"]
    how = f"exit status {done.returncode}" if done.returncode >= 0 else f"signal {-done.returncode}"
    return f"paddle2onnx could not convert the model ({how}): {said[-1]}"


def unsupported_operators(program: Path) -> List[str]:
    """The operators of a ``jit.save`` program (PIR's JSON) that this paddle2onnx has no converter
    for, by Paddle's operator name; empty when it cannot tell. paddle2onnx lists its converters
    under the legacy names (``elementwise_add`` for PIR's ``add``): Paddle's own table maps them."""
    try:
        from paddle.incubate.autograd.phi_ops_map import op_map
        from paddle2onnx.paddle2onnx_cpp2py_export import get_all_supported_operators_pir

        supported = set(get_all_supported_operators_pir())
        text = Path(program).read_text()
    except (ImportError, OSError, AttributeError):
        return []
    legacy = {entry.get("phi_name"): name for name, entry in op_map.items()}
    # PIR's JSON names an operator "<dialect>.<name>": dialect 1 is Paddle's operators (pd_op).
    used = set(re.findall(r'"#":\s*"1\.([a-z][a-z_0-9]*)"', text)) - _NOT_COMPUTED
    used = {name for name in used if not name.startswith(("a_", "t_"))}  # attribute and type tags
    return sorted(name for name in used if name not in supported and legacy.get(name) not in supported)
