"""torch idioms that PaConvert keeps as torch wrote them, computed by the converted Paddle code as
torch computes them (backends/paddle/translate.py): layers passed as classes with torch's
keywords, in-place activations and dropout, tensor methods taking Python numbers, and every form
of ``view``. Each bridge against torch itself, on the same values."""

import functools

import numpy as np
import paddle
import pytest
import torch

from unitrain.backends.paddle import translate
from unitrain.backends.paddle.translate import _traceable_shapes

X = np.random.default_rng(0).normal(size=(4, 3, 5, 5)).astype(np.float32)


def _close(ours, theirs, tol=1e-6):
    np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=tol, atol=tol)


def test_a_batch_norm_passed_as_a_class_takes_torchs_keywords_in_torchs_meaning():
    code = "norm = partial(unitrain_paddle.BatchNorm2D, eps=0.001, momentum=0.01)\nb = unitrain_paddle.BatchNorm2D(4)\n"
    code += "def f(norm_layer=paddle.nn.BatchNorm1D):\n    return norm_layer(3)\n"
    rewritten, counts = _traceable_shapes(code)
    assert "partial(unitrain_paddle.TorchBatchNorm2d, eps=0.001, momentum=0.01)" in rewritten
    assert "b = unitrain_paddle.BatchNorm2D(4)" in rewritten  # a call: PaConvert converted its arguments
    assert "norm_layer=unitrain_paddle.TorchBatchNorm1d" in rewritten
    assert counts == {"nn.BatchNorm2d passed as a class": 1, "nn.BatchNorm1d passed as a class": 1}
    ours = functools.partial(translate.TorchBatchNorm2d, eps=1e-3, momentum=0.01)(3)
    theirs = functools.partial(torch.nn.BatchNorm2d, eps=1e-3, momentum=0.01)(3)
    for _ in range(2):  # training: the batch's statistics, and running ones updated with torch's momentum
        _close(ours(paddle.to_tensor(X)), theirs(torch.from_numpy(X)), 1e-5)
    _close(ours._mean, theirs.running_mean)
    _close(ours._variance, theirs.running_var)
    ours.eval(), theirs.eval()
    _close(ours(paddle.to_tensor(X)), theirs(torch.from_numpy(X)), 1e-5)
    plain = translate.TorchBatchNorm2d(3, affine=False, track_running_stats=False)
    assert plain.weight is None and plain.bias is None
    with pytest.raises(Exception, match=r"momentum=None\) \(a cumulative average\) has no Paddle counterpart"):
        translate.TorchBatchNorm2d(3, momentum=None)


@pytest.mark.parametrize(
    "name, args",
    [("SiLU", ()), ("Hardswish", ()), ("Hardsigmoid", ()), ("ReLU6", ()), ("ReLU", ()), ("ELU", (0.5,))]
    + [("CELU", (0.5,)), ("SELU", ()), ("Mish", ()), ("LeakyReLU", (0.2,))],
)
def test_in_place_activations_compute_torchs_values_out_of_place(name, args):
    x = paddle.to_tensor(X)
    ours = getattr(translate, name)(*args, inplace=True)(x)
    theirs = getattr(torch.nn, name)(*args, inplace=False)(torch.from_numpy(X))
    _close(ours, theirs)
    np.testing.assert_array_equal(x.numpy(), X)  # the input untouched: a backward may need it
    if args:  # torch's positional inplace, after the alpha or slope
        _close(getattr(translate, name)(*args, True)(x), theirs)
    functional = getattr(translate, name.lower().replace("leakyrelu", "leaky_relu"))
    _close(functional(x, *args, inplace=True), theirs)


def test_hardtanh_and_dropout_take_torchs_arguments():
    x = paddle.to_tensor(X)
    theirs = torch.nn.Hardtanh(min_val=0.0, max_val=0.5)(torch.from_numpy(X))
    _close(translate.Hardtanh(min_val=0.0, max_val=0.5, inplace=True)(x), theirs)
    _close(translate.Hardtanh(0.0, 0.5, True)(x), theirs)
    _close(translate.hardtanh(x, 0.0, 0.5, True), theirs)
    layer = translate.Dropout(0.5, True)
    layer.eval()
    np.testing.assert_array_equal(layer(x).numpy(), X)
    layer.train()
    dropped = layer(x).numpy()
    assert set(np.unique(np.round(dropped / np.where(X == 0, 1, X), 4))) <= {0.0, 2.0}
    np.testing.assert_array_equal(x.numpy(), X)
    # PaConvert writes torch's positions: (input, p, training, inplace); training=False is no dropout.
    np.testing.assert_array_equal(translate.dropout(x, 0.5, False, True).numpy(), X)


def test_tensor_methods_take_python_numbers_as_torch_does():
    x, t = paddle.to_tensor(X), torch.from_numpy(X.copy())
    for method, other in [("div", 0.8), ("div", 3), ("true_divide", 0.8), ("mul", 1.5), ("add", 2.0), ("sub", 0.25)]:
        _close(getattr(translate, method)(x, other), getattr(t, method)(other))
    _close(translate.add(x, 2.0, alpha=3), t.add(2.0, alpha=3))
    for method in ("gt", "ge", "lt", "le", "ne"):
        np.testing.assert_array_equal(getattr(translate, method)(x, 0.5).numpy(), getattr(t, method)(0.5).numpy())
    _close(translate.div(x, x + 1), t.div(t + 1))  # a tensor: Paddle's own method
    for method, other in [("div_", 0.8), ("mul_", 1.5), ("add_", 2.0), ("sub_", 0.25)]:
        ours, theirs = paddle.to_tensor(X), torch.from_numpy(X.copy())
        getattr(translate, method)(ours, other), getattr(theirs, method)(other)  # the result unused: in place
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert translate.add({1}, 2) is None  # anything else: its own method (a set's add)
    rewritten, counts = _traceable_shapes("noise.div_(survival_rate)\ny = x.div(keep_prob)\nseen.add(name)\n")
    assert rewritten.splitlines()[1:] == [
        "unitrain_paddle.div_(noise, survival_rate)",
        "y = unitrain_paddle.div(x, keep_prob)",
        "unitrain_paddle.add(seen, name)",
    ]


def test_every_form_of_view_reshapes_as_torch_and_traces():
    x, t = paddle.to_tensor(X), torch.from_numpy(X)
    for args in [(-1,), ((4, -1),), ([4, 75],), (paddle.to_tensor(-1),)]:
        torch_args = tuple(int(a) if isinstance(a, paddle.Tensor) else a for a in args)
        _close(translate.view(x, *args), t.view(*torch_args))
    assert translate.view(x, paddle.int32).dtype == paddle.int32  # a dtype: Paddle's own view

    class Flat(paddle.nn.Layer):
        def forward(self, x):
            return translate.view(x, -1)

    spec = [paddle.static.InputSpec([None, 3, 5, 5], "float32")]
    traced = paddle.jit.to_static(Flat(), input_spec=spec, full_graph=True)
    assert traced(x).shape == [4 * 75]
