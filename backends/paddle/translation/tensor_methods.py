"""torch's tensor methods on Paddle tensors, for translated code (reached through
:mod:`unitrain.backends.paddle.translate`, where :class:`~unitrain.backends.paddle.translation.rewrite._Shapes`
routes calls): ``Tensor.split`` and the one-argument ``Tensor.view`` in forms Paddle's tracers take,
the arithmetic and comparisons that take a Python number as torch's do, ``device=t.device`` and
``torch._assert``. No paddle import at module level."""

from __future__ import annotations

from unitrain.errors import UnitrainError


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


def device_of(tensor):
    """torch's ``t.device`` as a device argument: the tensor's in dygraph; while tracing, None
    (the program's device), since a legacy program's tensors have none (PIR's warn)."""
    import paddle

    return tensor.device if paddle.in_dynamic_mode() else None


def torch_assert(condition, message) -> None:
    """torch._assert: an assert that tracing keeps."""
    assert condition, message
