"""torch's interpolate on Paddle, for translated code (:mod:`unitrain.backends.paddle.translate`).

Paddle 3.3.1's Inference cannot run any interpolation op of a PIR program with oneDNN (the op's
``scale`` attribute, a list of doubles even when empty, is a type its oneDNN instruction does not
convert), and in a legacy program (the int8 path) oneDNN's nearest samples otherwise than torch
where sizes are not multiples. A traced program therefore gets torch's sampling written out as
gathers and constant weights; dygraph keeps Paddle's kernels where they sample as torch's.
No paddle import at module level: the translate module loads without it.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["interpolate", "upsample", "upsample_layers"]


def interpolate(
    input,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
    name=None,
):
    """torch.nn.functional.interpolate. A traced program gets torch's sampling as gathers and
    weighted sums (:func:`_resampled`), where its spatial sizes are fixed: Paddle 3.3.1's
    Inference cannot run any interpolation op of a PIR program with oneDNN (the op's ``scale``
    attribute, a list of doubles even when empty, is a type its oneDNN instruction does not
    convert), and in a legacy program (the int8 path) oneDNN's nearest samples otherwise than
    torch where the sizes are not multiples (7x8 to 11x13: 4.8 off). Dygraph (training) keeps
    Paddle's kernels, several times quicker, where they sample as torch's (:func:`_paddle_alike`)."""
    import paddle
    from paddle.nn import functional as F

    if mode in ("nearest", "nearest-exact", "area") and align_corners is not None:
        raise ValueError(
            "align_corners option can only be set with the interpolating modes: linear | bilinear | bicubic | trilinear"
        )
    spatial = list(input.shape[2:])
    sizes, scales = _torch_sizes(spatial, size, scale_factor, recompute_scale_factor)
    if sizes and not antialias and input.ndim in _TAPS.get(mode, (None, ()))[1]:
        alike = _paddle_alike(mode, spatial, sizes, scales, bool(align_corners))
        if not paddle.in_dynamic_mode() or not alike:
            return _resampled(input, mode, sizes, scales, bool(align_corners))
    if mode == "area" and sizes:  # torch: adaptive average pooling to the sizes it computes
        size, scale_factor, recompute_scale_factor = sizes, None, None
    return F.interpolate(
        input,
        size,
        scale_factor,
        mode,
        bool(align_corners),
        recompute_scale_factor=recompute_scale_factor,
        antialias=antialias,
    )


def upsample(x, size=None, scale_factor=None, mode="nearest", align_corners=None, name=None):
    """torch.nn.functional.upsample (and upsample_nearest/bilinear), which PaConvert writes with ``x=``."""
    return interpolate(x, size, scale_factor, mode, align_corners)


def _torch_sizes(spatial, size, scale_factor, recompute):
    """torch's output sizes, and the scales its kernels map coordinates with (None: in/out); None
    where they are not known while tracing (a dynamic spatial size, a tensor argument) or the
    arguments are wrong, for Paddle's interpolate to handle or refuse."""
    rank = len(spatial)
    if (size is None) == (scale_factor is None) or not all(isinstance(d, numbers.Integral) and d >= 0 for d in spatial):
        return None, None
    if size is not None:
        sizes = list(size) if isinstance(size, (list, tuple)) else [size] * rank
        known = len(sizes) == rank and all(isinstance(s, numbers.Integral) for s in sizes)
        return (sizes, [None] * rank) if known else (None, None)
    factors = list(scale_factor) if isinstance(scale_factor, (list, tuple)) else [scale_factor] * rank
    if len(factors) != rank or not all(isinstance(f, numbers.Real) and f > 0 for f in factors):
        return None, None
    sizes = [math.floor(d * float(f)) for d, f in zip(spatial, factors)]
    # recompute_scale_factor: torch maps with in/out, as for a size.
    return sizes, [None if recompute else float(f) for f in factors]


def _paddle_alike(mode, spatial, sizes, scales, align_corners):
    """Whether Paddle's kernel samples as torch's. It lacks 'nearest-exact' and 1-D 'nearest'. Where
    a scale factor is not out/in exactly (2.3 on 5: 11), torch maps with the factor and Paddle
    too, but each copies some axes the other samples (torch: an axis whose size a linear mode
    keeps, a 2-D nearest kept or doubled at small sizes; Paddle: a bicubic whose sizes are all
    kept). To one pixel without align_corners, Paddle samples the first, torch the middle."""
    if mode == "nearest-exact" or (mode == "nearest" and len(spatial) == 1):
        return False
    exact = all(s is None or d * s == n for d, n, s in zip(spatial, sizes, scales))
    return exact and (mode == "nearest" or align_corners or min(sizes) > 1)


def _resampled(x, mode, sizes, scales, align_corners):
    """What torch's CPU kernels compute, one spatial axis at a time from the last (the order in
    which they sum): gathered rows times constant weights."""
    import paddle

    spatial = list(x.shape[2:])
    taps = _TAPS[mode][0]
    # torch's 2-D nearest kernel for outputs up to 128 (H + W) copies an axis whose size a scale
    # keeps or doubles; its generic kernel samples floor(i / scale) there.
    copies = mode == "nearest" and x.ndim == 4 and sum(sizes) <= 128
    for axis in reversed(range(len(spatial))):
        index, weights = taps(spatial[axis], sizes[axis], scales[axis], align_corners, copies)
        if index is None:  # the axis as it is
            continue
        shape = [-1] + [1] * (len(spatial) - 1 - axis)
        out = None
        for k in range(len(index)):
            term = paddle.index_select(x, paddle.to_tensor(index[k]), axis=axis + 2)
            if weights is not None:
                term = term * paddle.to_tensor(weights[k].reshape(shape), dtype=x.dtype)
            out = term if out is None else out + term
        x = out
    return x


# The sampling of aten/src/ATen/native/UpSample.h, in float32 as torch computes it for float32.
def _ratio(n_in, n_out, scale, align_corners):
    f = np.float32
    if align_corners:
        return f(n_in - 1) / f(n_out - 1) if n_out > 1 else f(0)
    return f(1.0 / scale) if scale else f(n_in) / f(n_out)


def _source(n_in, n_out, scale, align_corners, cubic):
    f = np.float32
    ratio, dst = _ratio(n_in, n_out, scale, align_corners), np.arange(n_out, dtype=f)
    if align_corners:
        return ratio * dst
    # Fused, as torch computes it: rounded twice, an output 1e-5 off at 200 pixels.
    src = _fma(ratio, dst + f(0.5), -0.5)
    return src if cubic else np.maximum(src, f(0))


def _nearest_taps(n_in, n_out, scale, align_corners, copies, exact=False):
    if copies and n_out == n_in:
        return None, None
    if copies and n_out == 2 * n_in:
        return (np.arange(n_out) // 2)[None], None
    dst = np.arange(n_out, dtype=np.float32) + np.float32(0.5 if exact else 0)
    return np.minimum(np.floor(dst * _ratio(n_in, n_out, scale, False)).astype(np.int64), n_in - 1)[None], None


def _linear_taps(n_in, n_out, scale, align_corners, copies):
    if n_out == n_in:  # torch copies such an axis whatever the scale
        return None, None
    src = _source(n_in, n_out, scale, align_corners, cubic=False)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    l1 = np.clip(src - i0.astype(np.float32), np.float32(0), np.float32(1))
    return np.stack([i0, i0 + (i0 < n_in - 1)]), np.stack([np.float32(1) - l1, l1])


def _fma(a, b, c):
    """a * b + c rounded once to float32, as torch's x86 builds compute such expressions."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(np.float32)


def _cubic_taps(n_in, n_out, scale, align_corners, copies):
    f, a = np.float32, np.float32(-0.75)
    src = _source(n_in, n_out, scale, align_corners, cubic=True)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    t = np.clip(src - i0.astype(f), f(0), f(1))
    # torch's cubic_convolution1 and 2 (A = -0.75), their multiply-adds fused (2e-6 off unfused)
    near = lambda x: _fma(_fma(a + f(2), x, -(a + f(3))) * x, x, f(1))  # noqa: E731
    far = lambda x: _fma(_fma(_fma(a, x, -(f(5) * a)), x, f(8) * a), x, -(f(4) * a))  # noqa: E731
    weights = [far(t + f(1)), near(t), near(f(1) - t), far(f(1) - t + f(1))]
    return np.stack([np.clip(i0 - 1 + j, 0, n_in - 1) for j in range(4)]), np.stack(weights)


#: mode -> (its taps, the input ranks torch takes it for)
_TAPS = {
    "nearest": (_nearest_taps, (3, 4, 5)),
    "nearest-exact": (lambda *args: _nearest_taps(*args, exact=True), (3, 4, 5)),
    "linear": (_linear_taps, (3,)),
    "bilinear": (_linear_taps, (4,)),
    "trilinear": (_linear_taps, (5,)),
    "bicubic": (_cubic_taps, (4,)),
}


def upsample_layers():
    """torch's Upsample layers on :func:`interpolate`, defined on first use."""
    from paddle import nn

    class Upsample(nn.Layer):
        """torch.nn.Upsample on :func:`interpolate` (Paddle's own layer calls Paddle's interpolate)."""

        def __init__(
            self, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None
        ):
            super().__init__()
            self.size, self.scale_factor, self.mode = size, scale_factor, mode
            self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

        def forward(self, input):
            return interpolate(
                input, self.size, self.scale_factor, self.mode, self.align_corners, self.recompute_scale_factor
            )

    class UpsamplingNearest2d(Upsample):
        def __init__(self, size=None, scale_factor=None):
            super().__init__(size, scale_factor, "nearest")

    class UpsamplingBilinear2d(Upsample):
        def __init__(self, size=None, scale_factor=None):
            super().__init__(size, scale_factor, "bilinear", align_corners=True)

    return {
        "Upsample": Upsample,
        "UpsamplingNearest2d": UpsamplingNearest2d,
        "UpsamplingBilinear2d": UpsamplingBilinear2d,
    }
