"""PyTorch code as Paddle code: PaConvert, then unitrain's substitutions.

PaConvert (PaddlePaddle's own converter) writes code for Paddle's torch-compatible API. Two
kinds of its output are replaced here, in the converted text, and docs/models.md lists both:

- a layer whose Paddle meaning differs from torch's and changes results: ``paddle.nn.BatchNorm2D``
  folds the biased batch variance into its running variance (torch: the unbiased one), so it
  becomes unitrain's BatchNorm2D, which keeps torch's;
- a name or an argument PaConvert writes that the installed Paddle does not have (it follows
  Paddle's development API): ``paddle.nn.MaxPool1d/2d/3d`` become bridges below with torch's
  arguments, and ``ReLU``, ``LeakyReLU``, ``relu``, ``leaky_relu`` and ``mish`` take torch's
  ``inplace`` (computed out of place: the same values, unless the code reads the input again
  expecting it changed). Any other missing name is refused in one line (:func:`missing_names`),
  never an AttributeError;
- torch's shape arguments that Paddle's dygraph takes but its tracers (export, int8) do not:
  ``t.view(a, b)``, ``t.expand(a, b)``, ``t.size(i)`` (:class:`_Shapes`);
- ``paddle.compat.nn.MultiheadAttention``, whose attention the legacy tracer of the int8 path
  does not take (:mod:`unitrain.backends.paddle.attention`);
- ``interpolate``, ``upsample`` and the ``Upsample`` layers: Paddle Inference's oneDNN path
  cannot run a PIR program with any interpolation op in it
  (:mod:`unitrain.backends.paddle.resample`).

No paddle import until :func:`missing_names` checks names.
"""

from __future__ import annotations

import ast
import logging
import re
import tempfile
import warnings
from pathlib import Path
from typing import Dict, List, Optional

from unitrain.backends.paddle import QUIET_ON_IMPORT
from unitrain.backends.paddle.attention import multihead_attention_layer, scaled_dot_product_attention  # noqa: F401
from unitrain.backends.paddle.resample import interpolate, upsample, upsample_layers  # noqa: F401 - converted code calls them
from unitrain.errors import BackendUnavailableError, UnitrainError
from unitrain.interface.translate import FileTranslation, Unconverted

__all__ = ["SOURCE", "converter_version", "missing_names", "translate_file"]

SOURCE: Optional[str] = "torch"
_BRIDGE = "unitrain_paddle"
_IMPORT = f"from unitrain.backends.paddle import translate as {_BRIDGE}\n"
#: PaConvert's output -> what the converted code uses instead (see the module's docstring).
_SUBSTITUTES = {
    "paddle.nn.BatchNorm2D": f"{_BRIDGE}.BatchNorm2D",
    "paddle.nn.MaxPool1d": f"{_BRIDGE}.MaxPool1d",
    "paddle.nn.MaxPool2d": f"{_BRIDGE}.MaxPool2d",
    "paddle.nn.MaxPool3d": f"{_BRIDGE}.MaxPool3d",
    "paddle._assert": f"{_BRIDGE}.torch_assert",
    "paddle.nn.ReLU": f"{_BRIDGE}.ReLU",
    "paddle.nn.LeakyReLU": f"{_BRIDGE}.LeakyReLU",
    "paddle.nn.functional.relu": f"{_BRIDGE}.relu",
    "paddle.nn.functional.leaky_relu": f"{_BRIDGE}.leaky_relu",
    "paddle.nn.functional.mish": f"{_BRIDGE}.mish",
    "paddle.compat.nn.MultiheadAttention": f"{_BRIDGE}.MultiheadAttention",
    "paddle.compat.nn.functional.scaled_dot_product_attention": f"{_BRIDGE}.scaled_dot_product_attention",
    "paddle.nn.functional.interpolate": f"{_BRIDGE}.interpolate",
    "paddle.nn.functional.upsample": f"{_BRIDGE}.upsample",
    "paddle.nn.Upsample": f"{_BRIDGE}.Upsample",
    "paddle.nn.UpsamplingNearest2d": f"{_BRIDGE}.UpsamplingNearest2d",
    "paddle.nn.UpsamplingBilinear2d": f"{_BRIDGE}.UpsamplingBilinear2d",
}
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
        # Its log is read from the file, never shown: not even the banner it logs on creation.
        previous = logging.root.manager.disable
        logging.disable(logging.CRITICAL)
        try:
            converter = converter_class(log_dir=str(log_file), log_level="INFO")
        finally:
            logging.disable(previous)
        converter.logger.propagate = False
        try:
            converted, _ = converter.run(str(source), str(out))
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
    out.write_text(code, encoding="utf-8")
    return FileTranslation(converted=converted, unconverted=unconverted, substituted=substituted)


def _substitute(code: str) -> tuple[str, Dict[str, int]]:
    substituted: Dict[str, int] = {}
    for name, bridge in _SUBSTITUTES.items():
        code, count = re.subn(rf"(?<![\w.]){re.escape(name)}\b", bridge, code)
        if count:
            substituted[name] = count
    if substituted:
        code = _IMPORT + code
    return code, substituted


class _Shapes(ast.NodeTransformer):
    """torch's shape arguments, which PaConvert keeps because Paddle 3.3.1's dygraph takes them,
    in the form its tracers (``paddle.jit.to_static``, the legacy programs of its int8 path) also
    take: ``t.view(a, b)`` -> ``t.reshape([a, b])``, ``t.expand(a, b)`` -> ``t.expand([a, b])``,
    ``t.size(i)`` -> ``t.shape[i]``. Only calls of that exact form (positional arguments, none
    starred) on something other than a module name. Two more reach the bridges below: ``t.split(n,
    dim=d)`` (PaConvert's torch-style helper is set on dygraph tensors only, and Paddle's own
    split takes no ``dim``), and ``device=t.device`` (a legacy program's tensors have no device)."""

    def __init__(self) -> None:
        self.counts: Dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def _bridged(self, name: str, args: List[ast.expr], keywords: List[ast.keyword]) -> ast.Call:
        return ast.Call(ast.Attribute(ast.Name(_BRIDGE, ast.Load()), name, ast.Load()), args, keywords)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        for keyword in node.keywords:
            value = keyword.value
            if keyword.arg == "device" and isinstance(value, ast.Attribute) and value.attr == "device":
                if _dotted(value) is None:  # a tensor's, not paddle.device
                    self._count("device=Tensor.device")
                    keyword.value = ast.copy_location(self._bridged("device_of", [value.value], []), value)
        if not isinstance(func, ast.Attribute) or any(isinstance(a, ast.Starred) for a in node.args):
            return node
        if isinstance(func.value, ast.Name) and func.value.id in ("paddle", _BRIDGE, "self"):
            return node
        if func.attr == "split" and any(k.arg == "dim" for k in node.keywords) and len(node.args) == 1:
            self._count("Tensor.split(size, dim=)")
            return ast.copy_location(self._bridged("split", [func.value, *node.args], node.keywords), node)
        if node.keywords:
            return node
        if func.attr in ("view", "expand") and len(node.args) >= 2:
            self._count(f"Tensor.{func.attr}(*sizes)")
            method = "reshape" if func.attr == "view" else "expand"
            return ast.copy_location(
                ast.Call(ast.Attribute(func.value, method, ast.Load()), [ast.List(node.args, ast.Load())], []), node
            )
        if func.attr == "size" and len(node.args) == 1:
            self._count("Tensor.size(dim)")
            shape = ast.Attribute(func.value, "shape", ast.Load())
            return ast.copy_location(ast.Subscript(shape, node.args[0], ast.Load()), node)
        return node


def _traceable_shapes(code: str) -> tuple[str, Dict[str, int]]:
    shapes = _Shapes()
    tree = ast.fix_missing_locations(shapes.visit(ast.parse(code)))
    if not shapes.counts:
        return code, {}
    code = ast.unparse(tree) + "\n"
    bridged = f"{_BRIDGE}." in code and _IMPORT not in code
    return (_IMPORT + code if bridged else code), shapes.counts


def _dotted(node: ast.AST) -> Optional[str]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "paddle":
        return ".".join(["paddle", *reversed(parts)])
    return None


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


# --- the substitutes ---------------------------------------------------------------------------
def _bridges():
    """Defined on first use, so that importing this module does not import paddle."""
    from paddle import nn

    from unitrain.backends.paddle.models import BatchNorm2D

    def max_pool(paddle_class, torch_name):
        class MaxPool(paddle_class):
            """torch's {name}(kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
            ceil_mode=False) on Paddle's layer, which has no dilation."""

            def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
                if dilation not in (1, (1,), (1, 1), (1, 1, 1)):
                    raise UnitrainError(
                        f"torch.nn.{torch_name}(dilation={dilation!r}) has no Paddle counterpart (Paddle's "
                        f"max pooling has no dilation); allowed: dilation=1, or write that layer of the Paddle half"
                    )
                super().__init__(kernel_size, stride, padding, return_mask=return_indices, ceil_mode=ceil_mode)

        MaxPool.__name__ = MaxPool.__qualname__ = torch_name
        return MaxPool

    class ReLU(nn.ReLU):
        def __init__(self, inplace=False, name=None):
            super().__init__(name=name)

    class LeakyReLU(nn.LeakyReLU):
        def __init__(self, negative_slope=0.01, inplace=False, name=None):
            super().__init__(negative_slope, name=name)

    return {
        "MultiheadAttention": multihead_attention_layer(),
        "ReLU": ReLU,
        "LeakyReLU": LeakyReLU,
        **upsample_layers(),
        "BatchNorm2D": BatchNorm2D,
        "MaxPool1d": max_pool(nn.MaxPool1D, "MaxPool1d"),
        "MaxPool2d": max_pool(nn.MaxPool2D, "MaxPool2d"),
        "MaxPool3d": max_pool(nn.MaxPool3D, "MaxPool3d"),
    }


def split(tensor, split_size_or_sections, dim=0):
    """torch's ``Tensor.split`` (a chunk size, or a list of sizes, along ``dim``) on any Paddle
    tensor, in dygraph and traced alike."""
    import paddle

    if isinstance(split_size_or_sections, int):
        size, chunk = tensor.shape[dim], split_size_or_sections
        if size is None or size < 0:
            raise UnitrainError(
                f"torch's Tensor.split({chunk}, dim={dim}) on a dimension whose size is only known when it runs "
                "cannot be traced for Paddle; allowed: a list of sizes, or a dimension of fixed size"
            )
        sections = [chunk] * (size // chunk) + ([size % chunk] if size % chunk else [])
        return paddle.split(tensor, sections, axis=dim)
    return paddle.split(tensor, list(split_size_or_sections), axis=dim)


def device_of(tensor):
    """torch's ``t.device`` as a device argument: the tensor's in dygraph; while tracing, None
    (the program's device), since a legacy program's tensors have none (PIR's warn)."""
    import paddle

    return tensor.device if paddle.in_dynamic_mode() else None


def torch_assert(condition, message) -> None:
    """torch._assert: an assert that tracing keeps."""
    assert condition, message


def relu(x, inplace=False, name=None):
    from paddle.nn import functional as F

    return F.relu(x, name=name)


def leaky_relu(x, negative_slope=0.01, inplace=False, name=None):
    from paddle.nn import functional as F

    return F.leaky_relu(x, negative_slope, name=name)


def mish(x, inplace=False, name=None):
    from paddle.nn import functional as F

    return F.mish(x, name=name)


_DEFINED: Dict[str, type] = {}
_CLASSES = (
    "BatchNorm2D",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "ReLU",
    "LeakyReLU",
    "Upsample",
    "UpsamplingNearest2d",
    "UpsamplingBilinear2d",
    "MultiheadAttention",
)


def __getattr__(name: str):
    if name in _CLASSES:
        if not _DEFINED:
            _DEFINED.update(_bridges())
        return _DEFINED[name]
    raise AttributeError(name)
