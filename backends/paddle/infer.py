"""Inference runtimes in paddle for a ``jit.save`` program: Paddle Inference with and without
its IR/oneDNN optimizations, and ``paddle.jit.load``; for a quantized legacy program
(``.pdmodel``, see ``quantize.py``) Paddle Inference on its legacy IR, also with oneDNN int8."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import paddle

from unitrain.errors import UnitrainError
from unitrain.interface.infer import Runtime

__all__ = ["runtimes"]


def _prefix(path: Path) -> str:
    return str(path)[: -len(path.suffix)]


def program_kernels(path: Path) -> Dict[str, int]:
    """Conv/linear and (de)quantize operators of the saved PIR program (``<name>.json``). This
    is the program as written, before Paddle Inference's passes: enough to call an fp32 model
    fp32; what those passes make of quantize ops would need the optimized program."""
    ops = re.findall(r'"#":"(?:1|pd_op)\.([a-z_0-9]+)"', path.read_text())
    return {
        "int8": 0,
        "float": sum(op in ("conv2d", "matmul", "fc", "depthwise_conv2d") for op in ops),
        "quantize": ops.count("quantize_linear"),
        "dequantize": ops.count("dequantize_linear"),
    }


def input_dtype(path: Path, name: Optional[str] = None) -> np.dtype:
    """The dtype the program declares for its input ``name`` (None, for a PIR program: its first),
    float32 images or int64 token ids: the PIR program's ``data`` op, or the legacy ProgramDesc's
    variable. (The predictor's input handle says float32 until data is copied in, whatever the
    program takes.)"""
    if path.suffix == ".pdmodel":
        return _legacy_input_dtype(path, name)
    for op in json.loads(path.read_text())["program"]["regions"][0]["blocks"][0]["ops"]:
        attrs = {a["N"]: a["AT"]["D"] for a in op.get("A", []) if isinstance(a, dict) and "AT" in a}
        if op["#"].endswith(".data") and name in (None, attrs.get("name")):
            return np.dtype(attrs["dtype"])
    raise UnitrainError(f"{path.name} declares no input named {name}")


def _legacy_input_dtype(path: Path, name: str) -> np.dtype:
    from paddle.base.data_feeder import convert_dtype

    desc = _program(path.read_bytes())  # kept alive: the block and its variables point into it
    var = desc.block(0).find_var(name.encode())
    if var is None:
        raise UnitrainError(f"{path.name} declares no input named {name}")
    return np.dtype(convert_dtype(var.dtype()))


#: Conv and linear operators before and after Paddle Inference's fusions.
CONV_LINEAR = {"conv2d", "fused_conv2d", "depthwise_conv2d", "fc", "mul", "matmul", "matmul_v2", "fused_matmul"}


#: What oneDNN may run in int8. Its default set also takes pool2d, whose int8 primitive oneDNN
#: refuses for small channel counts ("could not create a descriptor for a pooling forward
#: propagation primitive", the tiny model's 8-channel max-pool); relu is refused as unsupported.
ONEDNN_INT8_OPS = {"conv2d", "fused_conv2d", "fc", "matmul", "matmul_v2", "elementwise_add"}


def _program(data: bytes):
    from paddle.base import core

    return core.ProgramDesc(data)


def legacy_kernels(program: bytes) -> Dict[str, int]:
    """Kernels of a legacy ProgramDesc: conv/linear ops that oneDNN runs in int8
    (``mkldnn_data_type=int8``) or not, activation quantize ops (fake quantization when they
    survive to run time), and dequantize ops on weights stored as int8 (a dequantize on a
    float32 weight only simulates int8 and counts as quantization)."""
    from paddle.base import core

    desc = _program(program)  # kept alive: the block and its ops point into it
    block = desc.block(0)
    counts = {"int8": 0, "float": 0, "quantize": 0, "dequantize": 0}
    for i in range(block.op_size()):
        op = block.op(i)
        kind = op.type()
        if kind in CONV_LINEAR:
            int8 = op.has_attr("mkldnn_data_type") and op.attr("mkldnn_data_type") == "int8"
            counts["int8" if int8 else "float"] += 1
        elif kind == "quantize_linear" or kind.startswith("fake_quantize"):
            counts["quantize"] += 1
        elif kind == "dequantize_linear":
            var = block.find_var(op.input("X")[0].encode())
            stored_int8 = var is not None and var.persistable() and var.dtype() == core.VarDesc.VarType.INT8
            counts["dequantize" if stored_int8 else "quantize"] += 1
    return counts


def quantizes_activations(path: Path) -> bool:
    """Whether a legacy program quantizes activations (static PTQ, QAT): only then has oneDNN's
    int8 mode scales to run on. A weight-only program under ``enable_onednn_int8`` gave wrong
    logits here (held-out top-1 at chance), so it gets no int8 row."""
    desc = _program(path.read_bytes())
    block = desc.block(0)
    return any(block.op(i).type() == "quantize_linear" for i in range(block.op_size()))


class PaddleInference(Runtime):
    def __init__(self, path: Path, threads: int, optimized: bool, int8: bool = False):
        super().__init__(path, threads)
        self.optimized, self.int8, self.legacy = optimized, int8, path.suffix == ".pdmodel"
        self.name = "paddle.inference (IR + oneDNN)" if optimized else "paddle.inference (no IR optim)"
        if int8:
            # Timed against the fp32 model's oneDNN row: the same runtime, int8 allowed.
            self.name, self.baseline = "paddle.inference (IR + oneDNN int8)", self.name

    def load(self) -> None:
        from paddle import inference

        prefix = _prefix(self.path)
        config = inference.Config(prefix + (".pdmodel" if self.legacy else ".json"), prefix + ".pdiparams")
        config.disable_glog_info()
        config.set_cpu_math_library_num_threads(self.threads)
        config.switch_ir_optim(self.optimized)
        config.enable_onednn() if self.optimized else config.disable_onednn()
        if self.legacy:
            config.enable_new_ir(False)
        if self.int8:
            config.enable_onednn_int8(ONEDNN_INT8_OPS)
        if self.legacy and self.optimized:
            # What runs is the program after Paddle's IR passes, which it saves on request.
            with tempfile.TemporaryDirectory(prefix="unitrain-paddle-ir-") as tmp:
                config.enable_save_optim_model(True)
                config.set_optim_cache_dir(tmp)
                self.predictor = inference.create_predictor(config)
                self.kernels = legacy_kernels((Path(tmp) / "_optimized.pdmodel").read_bytes())
        else:
            self.predictor = inference.create_predictor(config)
            self.kernels = legacy_kernels(self.path.read_bytes()) if self.legacy else program_kernels(self.path)
        self.config = config
        name = self.predictor.get_input_names()[0]
        self.input, self.input_dtype = self.predictor.get_input_handle(name), input_dtype(self.path, name)
        self.output = self.predictor.get_output_handle(self.predictor.get_output_names()[0])

    def prepare(self, images: np.ndarray):
        # Copied into the predictor's input tensor before the clock; each run reuses it.
        self.input.reshape(list(images.shape))
        self.input.copy_from_cpu(np.ascontiguousarray(images, dtype=self.input_dtype))
        return None

    def run(self, prepared) -> np.ndarray:
        self.predictor.run()
        return self.output.copy_to_cpu()

    def observed(self) -> Dict[str, Any]:
        # Read back from the config after the predictor was created, i.e. what Paddle reports it
        # runs with, not what was asked; the kernels of a legacy program are read from the
        # program after the last IR pass, those of a PIR program from the program as saved.
        seen = {"ir_optim": self.config.ir_optim(), "onednn": self.config.onednn_enabled()}
        if self.int8:
            seen["onednn_int8"] = self.config.onednn_int8_enabled()
        return {**seen, "threads": self.config.cpu_math_library_num_threads(), "kernels": self.kernels}


class PaddleJit(Runtime):
    name = "paddle.jit.load"

    def load(self) -> None:
        paddle.set_device("cpu")
        self.layer = paddle.jit.load(_prefix(self.path))
        self.layer.eval()
        self.input_dtype = input_dtype(self.path)

    def prepare(self, images: np.ndarray):
        return paddle.to_tensor(np.ascontiguousarray(images, dtype=self.input_dtype))

    def run(self, prepared) -> np.ndarray:
        with paddle.no_grad():
            return self.layer(prepared).numpy()

    def observed(self) -> Dict[str, Any]:
        return {"threads": self.threads, "kernels": program_kernels(self.path)}


def runtimes(path: Path, threads: int) -> List[Runtime]:
    if path.suffix == ".pdmodel":  # a quantized legacy program: paddle.jit.load reads PIR programs only
        int8 = [PaddleInference(path, threads, optimized=True, int8=True)] if quantizes_activations(path) else []
        return [*int8, PaddleInference(path, threads, optimized=True), PaddleInference(path, threads, optimized=False)]
    return [
        PaddleInference(path, threads, optimized=True),
        PaddleInference(path, threads, optimized=False),
        PaddleJit(path, threads),
    ]
