"""torch's layers on Paddle, for translated code (reached through
:mod:`unitrain.backends.paddle.translate`, which hands out :func:`layer`): activations and dropout
taking torch's ``inplace``, LayerNorm with torch's attribute names, batch norms and max pooling
with torch's arguments, unitrain's BatchNorm2D (torch's running variance), and the attention and
upsampling layers of their own modules. Defined on first use: importing this module does not
import paddle."""

from __future__ import annotations

from typing import Dict, Optional

from unitrain.backends.paddle.attention import multihead_attention_layer
from unitrain.backends.paddle.resample import upsample_layers
from unitrain.backends.paddle.translation.functional import _torch_arguments
from unitrain.errors import UnitrainError


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


def _max_pool(paddle_class, torch_name: str):
    """torch's ``torch_name`` on Paddle's ``paddle_class``."""

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


def _bridges():
    """Defined on first use, so that importing this module does not import paddle."""
    from paddle import nn

    from unitrain.backends.paddle.models import BatchNorm2D

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
        "MaxPool1d": _max_pool(nn.MaxPool1D, "MaxPool1d"),
        "MaxPool2d": _max_pool(nn.MaxPool2D, "MaxPool2d"),
        "MaxPool3d": _max_pool(nn.MaxPool3D, "MaxPool3d"),
    }


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


def layer(name: str) -> Optional[type]:
    """The substitute class ``name``, or None where there is none; every one is defined on the
    first call (importing paddle)."""
    if name not in _CLASSES:
        return None
    if not _DEFINED:
        _DEFINED.update(_bridges())
    return _DEFINED[name]
