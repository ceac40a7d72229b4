"""Quantization in paddle, on the program path whose int8 reaches oneDNN's int8 kernels.

Paddle 3.3.1 has two: PIR (the default) and the legacy ProgramDesc. Under PIR,
``paddle.quantization``'s converted model cannot be saved with a dynamic batch (its quantize op
allocates a tensor of its input's shape), and Paddle Inference's PIR CPU passes do not turn
quantize/dequantize pairs into int8 kernels. The legacy program does: Paddle Inference with
``enable_new_ir(False)``, ``enable_onednn()`` and ``enable_onednn_int8()`` runs it as
``fused_conv2d``/``fc`` with ``mkldnn_data_type=int8``. So every artifact here is a legacy
inference program (``<stem>.pdmodel`` + ``.pdiparams``), written under ``OldIrGuard`` in an
otherwise PIR process:

- static: ``paddle.static.quantization.PostTrainingQuantization`` on the fp32 program, absmax
  calibration on unlabeled batches, per-channel weights, QDQ (``onnx_format``) output with the
  weights stored as int8.
- dynamic: ``paddle.quantization.PTQ`` with weight observers only (no data). Its ``convert``
  stores the int8-rounded weights as float32 behind dequantize ops: no smaller, fp32 compute.
  (``WeightQuantization.quantize_weight_to_int``, which stores int8, gave all-zero logits in
  Paddle Inference here, with and without oneDNN, so it is not used.) Paddle has no run-time
  activation quantization for a CPU (PostTrainingQuantization's dynamic ops are LSTM only;
  ``paddle.nn.quant.weight_only_linear`` has no CPU kernel in 3.3.1): a language model's ``nn.Linear``
  layers get the same weight observers, its tied head (a matmul of the embedding) none.
- qat: ``ImperativeQuantAware`` (per-channel weights, moving-average activations, QDQ output)
  on the dygraph model, fine-tuned by unitrain's own training loop, saved with
  ``save_quantized_model``.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Sequence, Tuple

import numpy as np
import paddle
from paddle.pir_utils import OldIrGuard
from paddle.static import Variable

from unitrain.backends.paddle.export import input_shape
from unitrain.host.console import logged_to_file, printed_to_log_file
from unitrain.interface.quantize import Saved

__all__ = ["QUANTIZER", "check", "prepare_qat", "save_qat", "save_quantized"]

QUANTIZER = {
    "dynamic": "paddle.quantization.PTQ, per-tensor absmax weight observers only, legacy program",
    "static": (
        "paddle.static.quantization.PostTrainingQuantization, abs_max, per-channel weights unless per_channel=false, "
        "legacy program"
    ),
    "qat": "paddle.quantization.ImperativeQuantAware, per-channel weights, moving-average activations, legacy program",
}
SUFFIXES = (".pdmodel", ".pdiparams")
#: Operators whose weights the quantizers quantize (conv, and the classifier as mul/matmul_v2).
QUANTIZABLE = ["conv2d", "depthwise_conv2d", "mul", "matmul", "matmul_v2"]


def check(method: str, per_channel: bool) -> None:
    """Paddle's toolkits ship with paddle: every method and setting is available."""


def _spec(example: np.ndarray):
    # Any batch size (a language model's: any length up to its context too, as its fp32 export);
    # the example's dtype (float32 images, int64 token ids).
    return [paddle.static.InputSpec(input_shape(example, None), example.dtype.name, "images")]


def _files(prefix: Path) -> List[Path]:
    return [prefix.with_name(prefix.name + s) for s in SUFFIXES]


def _append(op: str, inputs: Dict[str, object], attrs: Dict[str, object], like) -> object:
    """``op`` appended to the legacy program being traced (what the API did before 3.x)."""
    from paddle.base.layer_helper import LayerHelper

    helper = LayerHelper(op)
    out = helper.create_variable_for_type_inference(like.dtype)
    helper.append_op(type=op, inputs=inputs, outputs={"Out": out}, attrs=attrs)
    return out


def _unary(op: str) -> Callable:
    return lambda x, *args, name=None, **kwargs: _append(op, {"X": x}, {}, x)


def _matmul(x, y, transpose_x=False, transpose_y=False, name=None):
    return _append("matmul_v2", {"X": x, "Y": y}, {"trans_x": transpose_x, "trans_y": transpose_y}, x)


def _compat_linear(layer, input):
    # torch's layout ([out, in]) kept by paddle.compat.nn.Linear, which PaConvert writes.
    out = _matmul(input, layer.weight, transpose_y=True)
    return out if layer.bias is None else _append("elementwise_add", {"X": out, "Y": layer.bias}, {"axis": -1}, out)


def _legacy_versions() -> Dict[Tuple[object, str], Callable]:
    """Paddle 3.3.1 binds these APIs straight to its new kernels' entry points, which take PIR
    values only: traced into a legacy program, a model calling them fails (``gelu(): argument
    must be Value, but got Variable``). Their legacy operators still exist; these append them."""
    F = paddle.nn.functional
    return {
        (F, "gelu"): lambda x, approximate=False, name=None: _append(
            "gelu", {"X": x}, {"approximate": bool(approximate)}, x
        ),
        (F, "sigmoid"): _unary("sigmoid"),
        (paddle, "sigmoid"): _unary("sigmoid"),
        (F, "tanh"): _unary("tanh"),
        (paddle, "tanh"): _unary("tanh"),
        (paddle, "exp"): _unary("exp"),
        (paddle, "abs"): _unary("abs"),
        (F, "softplus"): lambda x, beta=1, threshold=20, name=None: _append(
            "softplus", {"X": x}, {"beta": float(beta), "threshold": float(threshold)}, x
        ),
        (paddle, "matmul"): _matmul,
        # A language model's causal mask (backends/paddle/models.py).
        (paddle, "triu"): lambda x, diagonal=0, name=None: _append(
            "tril_triu", {"X": x}, {"diagonal": int(diagonal), "lower": False}, x
        ),
        (paddle, "maximum"): lambda x, y, name=None: _append("elementwise_max", {"X": x, "Y": y}, {"axis": -1}, x),
        (paddle.compat.nn.Linear, "forward"): _compat_linear,
        # Swin's shifted windows (torch.roll).
        (paddle, "roll"): lambda x, shifts, axis=None, name=None, dims=None: _append(
            "roll", {"X": x}, {"shifts": _ints(shifts), "axis": _ints(dims if axis is None else axis)}, x
        ),
        # torch's tensor methods, kept by PaConvert: a legacy program's variables bind them to
        # the new entry points too (``attn.softmax(dim=-1)``, ``x.sigmoid()``).
        (Variable, "softmax"): lambda x, axis=-1, dtype=None, name=None, dim=None: _append(
            "softmax", {"X": x}, {"axis": int(axis if dim is None else dim)}, x
        ),
        **{(Variable, op): _unary(op) for op in ("sigmoid", "tanh", "exp")},
    }


def _ints(value) -> List[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


@contextlib.contextmanager
def legacy_operators() -> Iterator[None]:
    """While a legacy program is traced, the APIs of :func:`_legacy_versions` append legacy
    operators; anywhere else (dygraph, PIR) they are Paddle's own."""
    replaced = _legacy_versions()
    originals = {key: getattr(*key) for key in replaced}

    def either(key: Tuple[object, str], legacy: Callable) -> Callable:
        def call(*args, **kwargs):
            if paddle.in_dynamic_mode() or paddle.framework.in_pir_mode():
                return originals[key](*args, **kwargs)
            return legacy(*args, **kwargs)

        return call

    try:
        for key, legacy in replaced.items():
            setattr(key[0], key[1], either(key, legacy))
        yield
    finally:
        for key, original in originals.items():
            setattr(key[0], key[1], original)


def _legacy_save(layer: paddle.nn.Layer, prefix: Path, example: np.ndarray) -> List[Path]:
    layer.eval()
    with OldIrGuard(), legacy_operators():
        paddle.jit.save(layer, str(prefix), input_spec=_spec(example))
    prefix.with_name(prefix.name + ".pdiparams.info").unlink(missing_ok=True)  # only for training restarts
    return _files(prefix)


def _quantizable(model: paddle.nn.Layer, per_channel: bool) -> List[str]:
    """Paddle's per-channel weight scales for a matmul are along the [in, out] layout's out axis:
    a torch-layout Linear (paddle.compat.nn.Linear, [out, in]) cannot take them, so its matmul
    stays fp32 there (the report's ``effective`` column shows what ran int8)."""
    torch_layout = any(isinstance(layer, paddle.compat.nn.Linear) for layer in model.sublayers())
    if per_channel and torch_layout:
        return [op for op in QUANTIZABLE if not op.startswith(("mul", "matmul"))]
    return QUANTIZABLE


def _static_ptq(model: paddle.nn.Layer, calibration: List[np.ndarray], stem: Path, per_channel: bool) -> List[Path]:
    from paddle.static.quantization import PostTrainingQuantization

    with tempfile.TemporaryDirectory(dir=stem.parent, prefix=".paddle-ptq-") as tmp:
        _legacy_save(model, Path(tmp) / "fp32" / "model", calibration[0])
        with OldIrGuard():
            paddle.enable_static()
            try:
                ptq = PostTrainingQuantization(
                    executor=paddle.static.Executor(paddle.CPUPlace()),
                    model_dir=str(Path(tmp) / "fp32"),
                    model_filename="model.pdmodel",
                    params_filename="model.pdiparams",
                    data_loader=lambda: ({"images": b} for b in calibration),
                    batch_nums=len(calibration),
                    algo="abs_max",
                    quantizable_op_type=_quantizable(model, per_channel),
                    weight_quantize_type="channel_wise_abs_max" if per_channel else "abs_max",
                    onnx_format=True,
                )
                ptq.quantize()
                ptq.save_quantized_model(
                    save_model_path=str(Path(tmp) / "int8"),
                    model_filename="model.pdmodel",
                    params_filename="model.pdiparams",
                )
            finally:
                paddle.disable_static()
        targets = _files(stem)
        for source, target in zip(_files(Path(tmp) / "int8" / "model"), targets):
            shutil.move(source, target)
    return targets


#: What Paddle's quantizers say that a user cannot act on, sent to the run's log: their loggers
#: (progress, and "the old way to load inference model is deprecated", about the way they load
#: their own files), their progress bars, and warnings about their own calls.
_QUANTIZER_LOGGERS = (
    "paddle.static.quantization.post_training_quantization",
    "paddle.static.io",
    "paddle.static.pir_io",
)
_QUANTIZER_BARS = ("Sampling stage", "Adding quant", "Preparation stage")
_QUANTIZER_WARNINGS = ("To copy construct from a tensor", "full_graph=False don't support input_spec")


@contextlib.contextmanager
def _quantizers_to_the_log() -> Iterator[None]:
    with logged_to_file(_QUANTIZER_LOGGERS), printed_to_log_file(_QUANTIZER_BARS), warnings.catch_warnings():
        for message in _QUANTIZER_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        yield


# QuantizeModule.save_quantized's signature, parameter for parameter (tests/test_layers.py checks it).
def save_quantized(
    model: paddle.nn.Layer,
    method: str,
    calibration: Iterable[np.ndarray],
    stem: Path,
    reduce_range: bool,
    per_channel: bool,
    batches: Sequence[int],
) -> Saved:
    """``<stem>.pdmodel`` + ``<stem>.pdiparams`` for any batch size; ``calibration`` is only
    read by the static method. (``reduce_range`` has no counterpart in Paddle's quantizers.)"""
    with _quantizers_to_the_log():
        return _save_quantized(model, method, calibration, stem, per_channel)


def _save_quantized(
    model: paddle.nn.Layer,
    method: str,
    calibration: Iterable[np.ndarray],
    stem: Path,
    per_channel: bool,
) -> Saved:
    batches = list(calibration)
    model.eval()
    if method == "static":
        return [(_static_ptq(model, batches, stem, per_channel), None)]
    from paddle.quantization import PTQ, QuantConfig
    from paddle.quantization.observers import AbsmaxObserver

    ptq = PTQ(QuantConfig(activation=None, weight=AbsmaxObserver(quant_bits=8)))
    observed = ptq.quantize(model, inplace=False)
    with paddle.no_grad():
        observed(paddle.to_tensor(np.asarray(batches[0])))  # weight observers read the weights on the first call
    return [(_legacy_save(ptq.convert(observed, inplace=True), stem, batches[0]), None)]


def prepare_qat(model: paddle.nn.Layer, example: np.ndarray, reduce_range: bool) -> paddle.nn.Layer:
    """The model with fake quantization on conv/linear inputs and weights, trainable by unitrain's loop."""
    from paddle.quantization import ImperativeQuantAware

    qat = ImperativeQuantAware(
        quantizable_layer_type=["Conv2D", "Linear"],
        weight_quantize_type="channel_wise_abs_max",
        activation_quantize_type="moving_average_abs_max",
        onnx_format=True,
    )
    qat.quantize(model)
    model._unitrain_qat = qat  # save_quantized_model belongs to the object that prepared the model
    return model


def save_qat(prepared: paddle.nn.Layer, stem: Path, example: np.ndarray, batches: Sequence[int]) -> Saved:
    prepared.eval()
    with legacy_operators(), _quantizers_to_the_log():
        prepared._unitrain_qat.save_quantized_model(prepared, str(stem), input_spec=_spec(example))
    stem.with_name(stem.name + ".pdiparams.info").unlink(missing_ok=True)
    return [(_files(stem), None)]
