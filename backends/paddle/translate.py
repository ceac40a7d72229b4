"""PyTorch code as Paddle code: PaConvert, then unitrain's substitutions.

PaConvert (PaddlePaddle's own code converter) writes code for Paddle's torch-compatible API. Two
kinds of its output are replaced here, in the translated text, and docs/models.md lists both:

- a layer whose Paddle meaning differs from torch's and changes results: ``paddle.nn.BatchNorm2D``
  folds the biased batch variance into its running variance (torch: the unbiased one), so it
  becomes unitrain's BatchNorm2D, which keeps torch's;
- a name or an argument PaConvert writes that the installed Paddle does not have (it follows
  Paddle's development API): ``paddle.nn.MaxPool1d/2d/3d`` become bridges with torch's
  arguments, and ``ReLU``, ``LeakyReLU``, ``relu``, ``leaky_relu`` and ``mish`` take torch's
  ``inplace`` (computed out of place: the same values, unless the code reads the input again
  expecting it changed). Any other missing name is refused in one line (:func:`missing_names`),
  never an AttributeError;
- torch's shape arguments that Paddle's dygraph takes but its tracers (export, int8) do not:
  ``t.view(a, b)``, ``t.expand(a, b)``, ``t.size(i)``;
- ``paddle.compat.nn.MultiheadAttention``, whose attention the legacy tracer of the int8 path
  does not take (:mod:`unitrain.backends.paddle.attention`);
- ``interpolate``, ``upsample`` and the ``Upsample`` layers: Paddle Inference's oneDNN path
  cannot run a PIR program with any interpolation op in it
  (:mod:`unitrain.backends.paddle.resample`).

This module runs PaConvert and checks the names its output uses; the rewriting and the
substitutes, which translated code reaches through this module as ``unitrain_paddle``, are in
:mod:`unitrain.backends.paddle.translation` (the text and syntax tree rewritten: ``rewrite``;
torch's tensor methods, functional activations and layers: ``tensor_methods``, ``functional``,
``layers``). No paddle import until :func:`missing_names` checks names.
"""

from __future__ import annotations

import ast
import logging
import re
import tempfile
import warnings
from pathlib import Path
from typing import List, Optional

# Imported with noqa F401: what translated code calls as ``unitrain_paddle.<name>`` (its layers:
# :func:`__getattr__`).
from unitrain.backends.paddle import QUIET_ON_IMPORT
from unitrain.backends.paddle.attention import scaled_dot_product_attention  # noqa: F401
from unitrain.backends.paddle.resample import interpolate, upsample  # noqa: F401
from unitrain.backends.paddle.translation import lines
from unitrain.backends.paddle.translation.functional import (  # noqa: F401
    celu,
    dropout,
    elu,
    hardsigmoid,
    hardswish,
    hardtanh,
    leaky_relu,
    mish,
    relu,
    relu6,
    selu,
    silu,
)
from unitrain.backends.paddle.translation.layers import layer
from unitrain.backends.paddle.translation.rewrite import _dotted, _substitute, _traceable_shapes
from unitrain.backends.paddle.translation.tensor_methods import (  # noqa: F401
    add,
    add_,
    device_of,
    div,
    div_,
    ge,
    gt,
    le,
    lt,
    mul,
    mul_,
    ne,
    split,
    sub,
    sub_,
    torch_assert,
    true_divide,
    view,
)
from unitrain.errors import BackendUnavailableError
from unitrain.interface.translate import FileTranslation, Unconverted

__all__ = ["SOURCE", "converter_version", "missing_names", "translate_file"]

# Translated code imports paddle itself, on the line after it imports this module, outside the
# filter the backend's modules load under (unitrain.interface.modules.load): those warnings are
# silenced for it here, and only those (their messages, from paddle's own modules).
for _message in QUIET_ON_IMPORT:
    warnings.filterwarnings("ignore", message=_message, category=UserWarning, module=r"paddle\.")

SOURCE: Optional[str] = "torch"
_NOT_SUPPORTED = re.compile(r"^\[(?P<file>[^\]]+?):(?P<line>\d+)\] \[Not Support\] convert (?P<api>\S+) to Paddle")


def _paconvert():
    try:
        from paconvert.converter import Converter
    except ImportError:
        raise BackendUnavailableError(
            "model.paddle=convert needs PaConvert, which is not installed; install it with: pip install "
            "'unitrain[convert]'"
        ) from None
    return Converter


def converter_version() -> str:
    _paconvert()
    from paconvert.version import __version__

    return f"paconvert {__version__}"


def translate_file(source: Path, out: Path) -> FileTranslation:
    converter_class = _paconvert()
    from paconvert.utils import UtilsFileHelper

    # PaConvert keeps the helpers a file needs (torch's Tensor.split, say) in a process-wide
    # singleton that writes into the first file it was made for: one helper per file converted.
    UtilsFileHelper._instance = None
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        log_file = Path(tmp) / "paconvert.log"
        # The source with its line markers (translation/lines.py), under its own name.
        text = source.read_text(encoding="utf-8")
        marked = lines.marked(text)
        given = source
        if marked is not None:
            given = Path(tmp) / "marked" / source.name
            given.parent.mkdir()
            given.write_text(marked, encoding="utf-8")
        # Its log is read from the file, never shown: not even the banner it logs on creation.
        previous = logging.root.manager.disable
        logging.disable(logging.CRITICAL)
        try:
            converter = converter_class(log_dir=str(log_file), log_level="INFO")
        finally:
            logging.disable(previous)
        converter.logger.propagate = False
        try:
            converted, _ = converter.run(str(given), str(out))
        finally:
            for handler in converter.logger.handlers[:]:
                handler.close()
                converter.logger.removeHandler(handler)
        said = log_file.read_text(encoding="utf-8", errors="replace").splitlines()
    unconverted = [
        Unconverted(api=m["api"], file=str(source), line=int(m["line"])) for m in map(_NOT_SUPPORTED.match, said) if m
    ]
    code, substituted = _substitute(out.read_text(encoding="utf-8"))
    if not unconverted:  # what the converter left marked is no longer Python
        code, shapes = _traceable_shapes(code)
        substituted.update(shapes)
    code, line_map = lines.unmarked(code, str(source))
    out.write_text(code, encoding="utf-8")
    lines.write_map(out, line_map)
    return FileTranslation(converted=converted, unconverted=unconverted, substituted=substituted)


def missing_names(code: str) -> List[str]:
    with warnings.catch_warnings():  # as when the backend loads (this module loads without paddle)
        for message in QUIET_ON_IMPORT:
            warnings.filterwarnings("ignore", message=message)
        import paddle

    logging.getLogger("paddle").setLevel(logging.ERROR)
    missing: List[str] = []
    seen = set()
    for node in ast.walk(ast.parse(code)):
        name = _dotted(node) if isinstance(node, ast.Attribute) else None
        if not name or name in seen:
            continue
        seen.add(name)
        obj = paddle
        for part in name.split(".")[1:]:
            if not hasattr(obj, part):
                missing.append(name)
                break
            obj = getattr(obj, part)
    # A chain and its own prefixes: name the shortest that is missing.
    return sorted(n for n in missing if not any(n != m and n.startswith(m + ".") for m in missing))


def __getattr__(name: str):
    """The substitute layers, defined on first use (importing paddle)."""
    found = layer(name)
    if found is None:
        raise AttributeError(name)
    return found
