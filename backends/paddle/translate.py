"""PyTorch code as Paddle code: PaConvert, then unitrain's substitutions.

PaConvert (PaddlePaddle's own code converter) writes code for Paddle's torch-compatible API. Two
kinds of its output are replaced here, in the translated text, and docs/models.md lists both:

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
from unitrain.backends.paddle.resample import interpolate, upsample, upsample_layers  # noqa: F401 - translated code calls them
from unitrain.errors import BackendUnavailableError, UnitrainError
from unitrain.interface.translate import FileTranslation, Unconverted

__all__ = ["SOURCE", "converter_version", "missing_names", "translate_file"]

SOURCE: Optional[str] = "torch"
_BRIDGE = "unitrain_paddle"
_IMPORT = f"from unitrain.backends.paddle import translate as {_BRIDGE}\n"
#: PaConvert's output -> what the translated code uses instead (see the module's docstring).
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
    "paddle.nn.LayerNorm": f"{_BRIDGE}.LayerNorm",
    **{f"paddle.nn.{name}": f"{_BRIDGE}.{name}" for name in ("SiLU", "Hardswish", "Hardsigmoid", "ReLU6", "ELU")},
    **{f"paddle.nn.{name}": f"{_BRIDGE}.{name}" for name in ("CELU", "SELU", "Hardtanh", "Mish", "Dropout")},
    **{
        f"paddle.nn.functional.{name}": f"{_BRIDGE}.{name}"
        for name in ("silu", "hardswish", "hardsigmoid", "relu6", "elu", "celu", "selu", "hardtanh", "dropout")
    },
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
    """torch's forms that PaConvert keeps, rewritten into what Paddle takes everywhere:

    - shape arguments that Paddle's dygraph takes but its tracers (``paddle.jit.to_static``, the
      legacy programs of its int8 path) do not: ``t.view(a, b)`` and ``t.reshape(a, b)`` ->
      ``t.reshape([a, b])``, ``t.view(x)`` -> :func:`view` (a size, a shape or a dtype),
      ``t.expand(a, b)`` -> ``t.expand([a, b])``, ``t.size(i)`` -> ``t.shape[i]``;
    - ``t.split(n, dim=d)`` -> :func:`split` (PaConvert's torch-style helper is set on dygraph
      tensors only, and Paddle's own split takes no ``dim``), ``device=t.device`` ->
      :func:`device_of` (a legacy program's tensors have no device);
    - ``t.div(x)``, ``mul``, ``add``, ``sub``, the comparisons ``gt``, ``ge``, ``lt``, ``le``,
      ``ne`` and the in-place ``div_``, ``mul_``, ``add_``, ``sub_`` -> the bridges of the same
      name, which take a Python number as torch does;
    - a batch norm class written where it is not called (``partial(nn.BatchNorm2d, eps=1e-3)``)
      -> ``TorchBatchNorm2d``, which takes the torch arguments it is called with later.

    Only method calls on something other than a module (``np.reshape(a, s)`` stays), none with
    starred arguments."""

    _BATCH_NORMS = {
        f"{_BRIDGE}.BatchNorm2D": "TorchBatchNorm2d",
        "paddle.nn.BatchNorm1D": "TorchBatchNorm1d",
        "paddle.nn.BatchNorm3D": "TorchBatchNorm3d",
    }

    def __init__(self, modules: set) -> None:
        self.counts: Dict[str, int] = {}
        self.modules = modules | {"paddle", _BRIDGE, "self"}
        self.called: set = set()

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def _bridged(self, name: str, args: List[ast.expr], keywords: List[ast.keyword]) -> ast.Call:
        return ast.Call(ast.Attribute(ast.Name(_BRIDGE, ast.Load()), name, ast.Load()), args, keywords)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        name = _dotted(node) or (f"{_BRIDGE}.{node.attr}" if _is_bridge(node) else None)
        if name in self._BATCH_NORMS and id(node) not in self.called:
            self._count(f"nn.{self._BATCH_NORMS[name][5:]} passed as a class")
            return ast.copy_location(
                ast.Attribute(ast.Name(_BRIDGE, ast.Load()), self._BATCH_NORMS[name], ast.Load()), node
            )
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.called.add(id(node.func))
        if isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass"):
            # A type test: the class as written (its torch-signature subclass would miss instances).
            self.called.update(id(n) for arg in node.args[1:] for n in ast.walk(arg))
        self.generic_visit(node)
        for keyword in node.keywords:
            value = keyword.value
            if keyword.arg == "device" and isinstance(value, ast.Attribute) and value.attr == "device":
                if _dotted(value) is None:  # a tensor's, not paddle.device
                    self._count("device=Tensor.device")
                    keyword.value = ast.copy_location(self._bridged("device_of", [value.value], []), value)
        func = node.func
        if not isinstance(func, ast.Attribute) or any(isinstance(a, ast.Starred) for a in node.args):
            return node
        if isinstance(func.value, ast.Name) and func.value.id in self.modules:
            return node
        rewritten = self._method(node, func)
        return node if rewritten is None else ast.copy_location(rewritten, node)

    def _method(self, node: ast.Call, func: ast.Attribute) -> Optional[ast.expr]:
        args, keywords = node.args, node.keywords
        if func.attr == "split" and any(k.arg == "dim" for k in keywords) and len(args) == 1:
            self._count("Tensor.split(size, dim=)")
            return self._bridged("split", [func.value, *args], keywords)
        if func.attr in _SCALAR_METHODS and len(args) == 1:
            self._count(f"Tensor.{func.attr}(number)")
            return self._bridged(func.attr, [func.value, *args], keywords)
        if keywords:
            return None
        if func.attr in ("view", "reshape", "expand") and len(args) >= 2:
            self._count(f"Tensor.{func.attr}(*sizes)")
            method = "expand" if func.attr == "expand" else "reshape"
            return ast.Call(ast.Attribute(func.value, method, ast.Load()), [ast.List(args, ast.Load())], [])
        if func.attr == "view" and len(args) == 1:
            self._count("Tensor.view(size or shape)")
            return self._bridged("view", [func.value, *args], [])
        if func.attr == "size" and len(args) == 1:
            self._count("Tensor.size(dim)")
            return ast.Subscript(ast.Attribute(func.value, "shape", ast.Load()), args[0], ast.Load())
        return None


def _is_bridge(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id == _BRIDGE


def _imported_names(tree: ast.AST) -> set:
    """The names a module's imports bind (``np``, ``math``, ``F``): calls on them are functions."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def _traceable_shapes(code: str) -> tuple[str, Dict[str, int]]:
    tree = ast.parse(code)
    shapes = _Shapes(_imported_names(tree))
    tree = ast.fix_missing_locations(shapes.visit(tree))
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
def _torch_arguments(args: tuple, kwargs: dict, inplace_at: int, renames: Optional[Dict[str, str]]) -> tuple:
    """torch's arguments without ``inplace`` (by keyword, or at its place ``inplace_at``), with
    torch's keyword names where Paddle's differ (``renames``)."""
    kwargs.pop("inplace", None)
    args = args[:inplace_at] + args[inplace_at + 1 :]
    for torch_name, paddle_name in (renames or {}).items():
        if torch_name in kwargs:
            kwargs[paddle_name] = kwargs.pop(torch_name)
    return args, kwargs


def _without_inplace(paddle_class, torch_name: str, inplace_at: int = 0, renames: Optional[Dict[str, str]] = None):
    """``paddle_class`` taking torch's ``inplace`` (computed out of place: an in-place activation
    or dropout is what paddle2onnx refuses and what breaks a backward that needs its input) and
    torch's keyword names where Paddle's differ: a layer passed as a class, in a ``partial`` or
    as a default, is called with the arguments PaConvert never saw."""

    class Layer(paddle_class):
        def __init__(self, *args, **kwargs):
            args, kwargs = _torch_arguments(args, kwargs, inplace_at, renames)
            super().__init__(*args, **kwargs)

    Layer.__name__ = Layer.__qualname__ = torch_name
    return Layer


def _torch_batch_norm(paddle_class, torch_name: str):
    """torch's ``{name}(num_features, eps, momentum, affine, track_running_stats)``, for a batch
    norm PaConvert wrote as a class without calling it (``partial(nn.BatchNorm2d, eps=1e-3,
    momentum=0.01)``, a ``norm_layer=nn.BatchNorm2d`` default): the arguments it is later called
    with are torch's, in torch's meaning (momentum: the new batch's weight; Paddle's: the old)."""

    class TorchBatchNorm(paddle_class):
        def __init__(
            self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None, dtype=None
        ):
            if momentum is None:
                raise UnitrainError(
                    f"torch.nn.{torch_name}(momentum=None) (a cumulative average) has no Paddle counterpart; "
                    "allowed: a momentum between 0 and 1"
                )
            super().__init__(
                num_features,
                momentum=1 - momentum,
                epsilon=eps,
                weight_attr=None if affine else False,
                bias_attr=None if affine else False,
                use_global_stats=None if track_running_stats else False,
            )

    TorchBatchNorm.__name__ = TorchBatchNorm.__qualname__ = torch_name
    return TorchBatchNorm


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

    class Dropout(nn.Dropout):
        """torch's Dropout(p, inplace), out of place."""

        def __init__(self, p=0.5, inplace=False, axis=None, mode="upscale_in_train", name=None):
            super().__init__(p, False, axis, mode, name)

    class LayerNorm(nn.LayerNorm):
        """Paddle's LayerNorm with torch's attribute names, which a subclass's own forward reads
        (timm's and torchvision's channels-first LayerNorm2d: ``F.layer_norm(x,
        self.normalized_shape, self.weight, self.bias, self.eps)``)."""

        normalized_shape = property(lambda self: tuple(self._normalized_shape))
        eps = property(lambda self: self._epsilon)

    activations = {name: _without_inplace(getattr(nn, name), name, at) for name, at in _ACTIVATIONS.items()}
    return {
        "MultiheadAttention": multihead_attention_layer(),
        **activations,
        "Hardtanh": _without_inplace(nn.Hardtanh, "Hardtanh", 2, {"min_val": "min", "max_val": "max"}),
        "Dropout": Dropout,
        "LayerNorm": LayerNorm,
        **upsample_layers(),
        "BatchNorm2D": BatchNorm2D,
        "TorchBatchNorm1d": _torch_batch_norm(nn.BatchNorm1D, "BatchNorm1d"),
        "TorchBatchNorm2d": _torch_batch_norm(BatchNorm2D, "BatchNorm2d"),
        "TorchBatchNorm3d": _torch_batch_norm(nn.BatchNorm3D, "BatchNorm3d"),
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


def view(tensor, shape_or_dtype):
    """torch's one-argument ``Tensor.view``: a size (``view(-1)``), a shape, or a dtype. A shape
    becomes ``reshape``, which Paddle's tracers take (its ``view`` is dygraph only)."""
    if not _is_tensor(tensor):
        return tensor.view(shape_or_dtype)
    if isinstance(shape_or_dtype, (list, tuple)):
        return tensor.reshape(list(shape_or_dtype))
    if isinstance(shape_or_dtype, int) or _is_tensor(shape_or_dtype):
        return tensor.reshape([shape_or_dtype])
    return tensor.view(shape_or_dtype)


def _is_tensor(value) -> bool:
    import paddle

    return isinstance(value, (paddle.Tensor, paddle.pir.Value, paddle.static.Variable))


def _number(tensor, other, args: tuple, kwargs: dict) -> bool:
    """Whether torch's ``tensor.<method>(other, ...)`` is one Paddle's method cannot take: a
    Python number (torchvision's stochastic depth divides by its survival rate, timm's drop path
    by ``keep_prob``) on a tensor, with at most torch's ``alpha``."""
    return _is_tensor(tensor) and isinstance(other, (int, float)) and not args and not set(kwargs) - {"alpha"}


def _in_place(tensor, paddle_method: str, value):
    """Paddle's in-place op with a 0-d tensor of the tensor's dtype (the same rounding as torch:
    a division, not a multiplication by its inverse)."""
    import paddle

    return getattr(tensor, paddle_method)(paddle.full([], value, tensor.dtype))


# Each its own def (Paddle's to_static converts a function by its source and name): a number goes
# through the operator (traced alike), anything else to the object's own method.
def div(tensor, other, *args, **kwargs):
    return tensor / other if _number(tensor, other, args, kwargs) else tensor.div(other, *args, **kwargs)


def true_divide(tensor, other, *args, **kwargs):
    return tensor / other if _number(tensor, other, args, kwargs) else tensor.true_divide(other, *args, **kwargs)


def mul(tensor, other, *args, **kwargs):
    return tensor * other if _number(tensor, other, args, kwargs) else tensor.mul(other, *args, **kwargs)


def add(tensor, other, *args, **kwargs):
    if _number(tensor, other, args, kwargs):
        return tensor + other * kwargs.get("alpha", 1)
    return tensor.add(other, *args, **kwargs)


def sub(tensor, other, *args, **kwargs):
    if _number(tensor, other, args, kwargs):
        return tensor - other * kwargs.get("alpha", 1)
    return tensor.sub(other, *args, **kwargs)


def gt(tensor, other, *args, **kwargs):
    return tensor > other if _number(tensor, other, args, kwargs) else tensor.gt(other, *args, **kwargs)


def ge(tensor, other, *args, **kwargs):
    return tensor >= other if _number(tensor, other, args, kwargs) else tensor.ge(other, *args, **kwargs)


def lt(tensor, other, *args, **kwargs):
    return tensor < other if _number(tensor, other, args, kwargs) else tensor.lt(other, *args, **kwargs)


def le(tensor, other, *args, **kwargs):
    return tensor <= other if _number(tensor, other, args, kwargs) else tensor.le(other, *args, **kwargs)


def ne(tensor, other, *args, **kwargs):
    return tensor != other if _number(tensor, other, args, kwargs) else tensor.ne(other, *args, **kwargs)


def div_(tensor, other, *args, **kwargs):
    if _number(tensor, other, args, kwargs):
        return _in_place(tensor, "divide_", other)
    return tensor.div_(other, *args, **kwargs)


def mul_(tensor, other, *args, **kwargs):
    if _number(tensor, other, args, kwargs):
        return _in_place(tensor, "multiply_", other)
    return tensor.mul_(other, *args, **kwargs)


def add_(tensor, other, *args, **kwargs):
    if _number(tensor, other, args, kwargs):
        return _in_place(tensor, "add_", other * kwargs.get("alpha", 1))
    return tensor.add_(other, *args, **kwargs)


def sub_(tensor, other, *args, **kwargs):
    if _number(tensor, other, args, kwargs):
        return _in_place(tensor, "subtract_", other * kwargs.get("alpha", 1))
    return tensor.sub_(other, *args, **kwargs)


#: Tensor methods taking a Python number in torch (:class:`_Shapes` routes calls through these).
_SCALAR_METHODS = (
    "div",
    "true_divide",
    "mul",
    "add",
    "sub",
    "gt",
    "ge",
    "lt",
    "le",
    "ne",
    "div_",
    "mul_",
    "add_",
    "sub_",
)


def device_of(tensor):
    """torch's ``t.device`` as a device argument: the tensor's in dygraph; while tracing, None
    (the program's device), since a legacy program's tensors have none (PIR's warn)."""
    import paddle

    return tensor.device if paddle.in_dynamic_mode() else None


def torch_assert(condition, message) -> None:
    """torch._assert: an assert that tracing keeps."""
    assert condition, message


def _functional(name: str, x, args: tuple, kwargs: dict, inplace_at: int = 0, renames=None):
    """``paddle.nn.functional.<name>`` with torch's arguments: ``inplace`` computed out of place."""
    from paddle.nn import functional as F

    args, kwargs = _torch_arguments(args, kwargs, inplace_at, renames)
    return getattr(F, name)(x, *args, **kwargs)


# Each its own def (Paddle's to_static converts a function by its source and name). torch's
# place of ``inplace`` after the input is 1 where an alpha or a slope comes first.
def relu(x, *args, **kwargs):
    return _functional("relu", x, args, kwargs)


def leaky_relu(x, *args, **kwargs):
    return _functional("leaky_relu", x, args, kwargs, 1)


def mish(x, *args, **kwargs):
    return _functional("mish", x, args, kwargs)


def silu(x, *args, **kwargs):
    return _functional("silu", x, args, kwargs)


def hardswish(x, *args, **kwargs):
    return _functional("hardswish", x, args, kwargs)


def hardsigmoid(x, *args, **kwargs):
    return _functional("hardsigmoid", x, args, kwargs)


def relu6(x, *args, **kwargs):
    return _functional("relu6", x, args, kwargs)


def elu(x, *args, **kwargs):
    return _functional("elu", x, args, kwargs, 1)


def celu(x, *args, **kwargs):
    return _functional("celu", x, args, kwargs, 1)


def selu(x, *args, **kwargs):
    return _functional("selu", x, args, kwargs)


def hardtanh(x, *args, **kwargs):
    return _functional("hardtanh", x, args, kwargs, 2, {"min_val": "min", "max_val": "max"})


def dropout(x, p=0.5, training=True, inplace=False, axis=None, mode="upscale_in_train", name=None):
    """torch's ``F.dropout(input, p, training, inplace)`` (PaConvert passes torch's positions;
    Paddle 3.3.1's third is ``axis``), out of place."""
    from paddle.nn import functional as F

    return F.dropout(x, p, axis=axis, training=training, mode=mode, name=name)


#: The activations whose torch layer takes ``inplace``, with its place among the arguments.
_ACTIVATIONS = {"ReLU": 0, "LeakyReLU": 1, "SiLU": 0, "Hardswish": 0, "Hardsigmoid": 0, "ReLU6": 0, "ELU": 1}
_ACTIVATIONS.update({"CELU": 1, "SELU": 0, "Mish": 0})
_DEFINED: Dict[str, type] = {}
_CLASSES = (
    *_ACTIVATIONS,
    "Hardtanh",
    "Dropout",
    "LayerNorm",
    "BatchNorm2D",
    "TorchBatchNorm1d",
    "TorchBatchNorm2d",
    "TorchBatchNorm3d",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
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
