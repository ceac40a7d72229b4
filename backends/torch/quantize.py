"""Quantization in torch: torchao's PT2E flow on a ``torch.export`` graph, saved as an
ExportedProgram (.pt2) whose conv and linear weights are stored as int8.

- static: ``X86InductorQuantizer`` (int8 activations per tensor, int8 weights per channel),
  calibrated on unlabeled batches; ``torch.compile`` with Inductor freezing then runs oneDNN
  int8 kernels (``backends/torch/infer.py`` looks for them in a profile).
- qat: ``prepare_qat_pt2e`` with the same quantizer in training mode (conv-BatchNorm folded
  with fake quantization), fine-tuned by unitrain's own training loop, then converted and saved
  like the static method.
- dynamic: torchao's int8 dynamic configs cover ``nn.Linear`` only, which in a ResNet is the
  classifier alone. unitrain's dynamic method stores every conv and linear weight as int8 (per
  output channel, symmetric) and dequantizes it for fp32 compute, Paddle's definition of
  dynamic post-training quantization: a smaller file, no data, no int8 kernels. A language
  model's Linears (and its tied head, an ``aten.linear`` on the token embedding) are stored so
  too; the embeddings stay float32.

Every program takes any batch; a language model's (its example carries ``max_length``) also any
length from 1 to its context, as its fp32 export does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from unitrain.backends.torch.export import dynamic_axes
from unitrain.errors import ConfigError, UnitrainError
from unitrain.host.console import logged_to_file
from unitrain.interface.quantize import Saved

__all__ = ["QUANTIZER", "check", "prepare_qat", "save_qat", "save_quantized"]


#: What importing torchao logs on a CPU that a user cannot act on (its CUDA kernels' libraries not
#: loaded, no Triton, torch's notes on its enums): to the run's log, not the console.
_IMPORT_LOGGERS = ("torchao", "torchao.kernel.intmm", "torch.utils._pytree")


def _torchao():
    try:
        with logged_to_file(_IMPORT_LOGGERS):
            from torchao.quantization.pt2e import quantize_pt2e  # noqa: F401
    except ImportError:
        raise UnitrainError(
            "quantization in torch needs torchao, which is not installed; install it with: pip install "
            "'unitrain[quantize]'"
        ) from None
    return quantize_pt2e


class WeightOnlyQuantizer:
    """Annotates the weight of every conv and linear for int8 per-channel storage, nothing else."""

    def __new__(cls, per_channel: bool = True):
        from torchao.quantization.pt2e.observer import MinMaxObserver, PerChannelMinMaxObserver
        from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, QuantizationSpec, Quantizer

        observer = PerChannelMinMaxObserver if per_channel else MinMaxObserver
        spec = QuantizationSpec(
            dtype=torch.int8,
            quant_min=-127,
            quant_max=127,
            qscheme=torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric,
            ch_axis=0,
            is_dynamic=False,
            observer_or_fake_quant_ctr=observer.with_args(eps=2**-12),
        )
        targets = {torch.ops.aten.conv2d.default, torch.ops.aten.linear.default}

        class _Quantizer(Quantizer):
            def annotate(self, model):
                for node in model.graph.nodes:
                    if node.op == "call_function" and node.target in targets:
                        node.meta["quantization_annotation"] = QuantizationAnnotation(
                            input_qspec_map={node.args[1]: spec}, _annotated=True
                        )
                return model

            def validate(self, model) -> None:
                pass

        return _Quantizer()


#: What writes each method's artifact (recorded in the manifest).
QUANTIZER = {
    "dynamic": "torchao PT2E, int8 weight-only annotation (unitrain's), per-channel unless per_channel=false",
    "static": "torchao PT2E, X86InductorQuantizer, per-channel weights, per-tensor activations",
    "qat": "torchao PT2E QAT, X86InductorQuantizer(is_qat=True), per-channel weights",
}


def _shapes(example: np.ndarray):
    """The exported program's dynamic axes: any batch, and a language model's time axis."""
    return (dynamic_axes(example, None),)


def check(method: str, per_channel: bool) -> None:
    """torchao must import (an installed package that fails to import is missing all the same),
    and its x86 quantizer quantizes static weights per channel only."""
    _torchao()
    if method == "static" and not per_channel:
        raise ConfigError(
            "per_channel",
            False,
            "true with backend=torch method=static (torchao's X86InductorQuantizer quantizes weights per channel only)",
        )


def _quantizer(method: str, reduce_range: bool, per_channel: bool):
    if method == "dynamic":
        return WeightOnlyQuantizer(per_channel)
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86

    # reduce_range (7-bit activations) where the CPU lacks VNNI: without it the AVX2 int8 dot
    # product (vpmaddubsw) can saturate its 16-bit sums.
    config = x86.get_default_x86_inductor_quantization_config(is_qat=method == "qat", reduce_range=reduce_range)
    return x86.X86InductorQuantizer().set_global(config)


def _drop_unused(module: torch.fx.GraphModule) -> None:
    """convert_pt2e leaves the float weights it replaced as attributes; exported, they would be
    saved beside the int8 ones and the file would be larger than the fp32 model's."""
    used = {n.target for n in module.graph.nodes if n.op == "get_attr"}
    for name in [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]:
        if name not in used:
            owner, _, attr = name.rpartition(".")
            delattr(module.get_submodule(owner) if owner else module, attr)


def _tensor(batch: np.ndarray) -> torch.Tensor:
    """A batch as the program takes it: its own dtype (float32 images, int64 token ids)."""
    return torch.from_numpy(np.ascontiguousarray(batch))


def _save(converted: torch.fx.GraphModule, example: np.ndarray, stem: Path) -> Saved:
    _drop_unused(converted)
    path = stem.with_name(stem.name + ".pt2")
    torch.export.save(torch.export.export(converted, (_tensor(example),), dynamic_shapes=_shapes(example)), path)
    return [([path], None)]


def _nonzero_batchnorm_scales(model: torch.nn.Module) -> None:
    """QAT folds each BatchNorm into its conv and divides the conv's output by the BN scale:
    a scale of exactly 0 (zero-initialised residual branches that never trained) gives NaN.
    A scale of 1e-6 instead changes that branch's output by at most 1e-6 of its input."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d) and module.weight is not None:
                tiny = module.weight.abs() < 1e-6
                module.weight[tiny] = 1e-6


def prepare_qat(model: torch.nn.Module, example: np.ndarray, reduce_range: bool) -> torch.nn.Module:
    """The model with fake quantization in training mode, trainable by unitrain's loop (its
    ``train()``/``eval()`` switch BatchNorm and dropout in the exported graph)."""
    quantize_pt2e = _torchao()
    from torchao.quantization.pt2e import allow_exported_model_train_eval

    _nonzero_batchnorm_scales(model)
    graph = torch.export.export(model.train(), (_tensor(example),), dynamic_shapes=_shapes(example)).module()
    return allow_exported_model_train_eval(quantize_pt2e.prepare_qat_pt2e(graph, _quantizer("qat", reduce_range, True)))


def save_qat(prepared: torch.nn.Module, stem: Path, example: np.ndarray, batches: Sequence[int]) -> Saved:
    """``<stem>.pt2`` (any batch): the fine-tuned model converted to int8 weights and quantize ops, as static."""
    quantize_pt2e = _torchao()
    prepared.eval()
    return _save(quantize_pt2e.convert_pt2e(prepared), example, stem)


# QuantizeModule.save_quantized's signature, parameter for parameter (tests/test_layers.py checks it).
def save_quantized(
    model: torch.nn.Module,
    method: str,
    calibration: Iterable[np.ndarray],
    stem: Path,
    reduce_range: bool,
    per_channel: bool,
    batches: Sequence[int],
) -> Saved:
    """``<stem>.pt2`` for any batch size; ``calibration`` is only read by the static method."""
    quantize_pt2e = _torchao()
    arrays = list(calibration)
    batches = [_tensor(b) for b in arrays]
    graph = torch.export.export(model.eval(), (batches[0],), dynamic_shapes=_shapes(arrays[0])).module()
    prepared = quantize_pt2e.prepare_pt2e(graph, _quantizer(method, reduce_range, per_channel))
    with torch.no_grad():
        for batch in batches if method == "static" else batches[:1]:
            prepared(batch)
    return _save(quantize_pt2e.convert_pt2e(prepared), arrays[0], stem)
