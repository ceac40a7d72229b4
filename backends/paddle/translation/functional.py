"""torch's functional activations and dropout on Paddle, for translated code (reached through
:mod:`unitrain.backends.paddle.translate`): torch's arguments, ``inplace`` computed out of place
(an in-place activation or dropout is what paddle2onnx refuses and what breaks a backward that
needs its input). No paddle import at module level."""

from __future__ import annotations

from typing import Dict, Optional


def _torch_arguments(args: tuple, kwargs: dict, inplace_at: int, renames: Optional[Dict[str, str]]) -> tuple:
    """torch's arguments without ``inplace`` (by keyword, or at its place ``inplace_at``), with
    torch's keyword names where Paddle's differ (``renames``)."""
    kwargs.pop("inplace", None)
    args = args[:inplace_at] + args[inplace_at + 1 :]
    for torch_name, paddle_name in (renames or {}).items():
        if torch_name in kwargs:
            kwargs[paddle_name] = kwargs.pop(torch_name)
    return args, kwargs


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
