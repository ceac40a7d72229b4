"""PaConvert's output rewritten into what runs as torch's code did: names replaced in its text
(:data:`_SUBSTITUTES`), then torch's forms that Paddle's tracers do not take rewritten in its
syntax tree (:class:`_Shapes`). The translated code reaches the substitutes as ``unitrain_paddle``,
the translate module under that name. No paddle import."""

from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional

_BRIDGE = "unitrain_paddle"
_IMPORT = f"from unitrain.backends.paddle import translate as {_BRIDGE}\n"
#: PaConvert's output -> what the translated code uses instead (see the translate module's docstring).
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
#: Tensor methods taking a Python number in torch (:class:`_Shapes` routes calls through the
#: substitutes of the same name, :mod:`unitrain.backends.paddle.translation.tensor_methods`).
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
      ``t.expand(a, b)`` -> ``t.expand([a, b])``, ``t.size(i)`` and ``t.size(dim=i)`` -> ``t.shape[i]``,
      ``t.size()`` -> ``tuple(t.shape)`` (torch.Size is a tuple: ``t.size()[:-1] + (n,)`` stays one);
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
        if func.attr == "size" and not args and [k.arg for k in keywords] == ["dim"]:
            self._count("Tensor.size(dim)")
            return ast.Subscript(ast.Attribute(func.value, "shape", ast.Load()), keywords[0].value, ast.Load())
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
        if func.attr == "size" and not args:
            # torch.Size is a tuple: sliced and added to tuples (``x.size()[:-1] + (n,)``, as
            # Hugging Face's GPT-2 writes it); Paddle's ``shape`` is a list, traced one whose
            # unknown sizes are tensors (a tuple of them reshapes as torch's does).
            self._count("Tensor.size()")
            return ast.Call(ast.Name("tuple", ast.Load()), [ast.Attribute(func.value, "shape", ast.Load())], [])
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
