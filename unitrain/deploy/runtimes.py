"""Running an exported model: ONNX Runtime (the framework-neutral runtime), the runtimes a
backend provides, the clock, and held-out accuracy."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from unitrain.deploy import artifacts
from unitrain.errors import BackendUnavailableError
from unitrain.interface.backend import get_backend
from unitrain.interface.infer import Runtime, infer_module

#: ONNX Runtime operators that compute in integers (static: QLinear*, QGemm; dynamic:
#: ConvInteger, MatMulInteger and its fused form), and the float ones they replace.
ORT_INT8 = {"QLinearConv", "QLinearMatMul", "QGemm", "ConvInteger", "MatMulInteger", "DynamicQuantizeMatMul"}


ORT_FLOAT = {"Conv", "FusedConv", "Gemm", "FusedGemm", "MatMul", "FusedMatMul"}


def onnx_kernels(op_types: List[str]) -> Dict[str, int]:
    """Integer and float conv/linear kernels, activation quantize and weight dequantize ops."""
    return {
        "int8": sum(op in ORT_INT8 for op in op_types),
        "float": sum(op in ORT_FLOAT for op in op_types),
        "quantize": sum(op in ("QuantizeLinear", "DynamicQuantizeLinear") for op in op_types),
        "dequantize": op_types.count("DequantizeLinear"),
    }


def onnx_session(path: Path, threads: Optional[int], optimize: bool = True, optimized_copy: Optional[Path] = None):
    """An ONNX Runtime session on the CPU with ``threads`` intra-op threads (None: its default)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise BackendUnavailableError(
            "running ONNX models needs onnxruntime, which is not installed; install it with: pip install "
            "'unitrain[export]'"
        ) from None
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    if optimized_copy:
        options.optimized_model_filepath = str(optimized_copy)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_input_dtype(session) -> np.dtype:
    """The dtype the model declares for its (first) input: ``tensor(float)`` float32 images,
    ``tensor(int64)`` token ids ..."""
    declared = session.get_inputs()[0].type  # e.g. "tensor(int64)"
    element = declared[len("tensor(") : -1]
    return np.dtype({"float": "float32", "double": "float64"}.get(element, element))


def run_onnx(session, images: np.ndarray, dtype: Optional[np.dtype] = None) -> np.ndarray:
    """The logits of ``images`` given as ``dtype`` (None: as the model's input declares)."""
    feed = np.ascontiguousarray(images, dtype=onnx_input_dtype(session) if dtype is None else dtype)
    return session.run(None, {session.get_inputs()[0].name: feed})[0]


class OnnxRuntime(Runtime):
    name = "onnxruntime"

    def load(self) -> None:
        import onnx

        # The graph ONNX Runtime really runs (after its fusions) is written out once and read
        # back for the kernels it uses: QLinearConv is int8, Conv with DequantizeLinear is not.
        with tempfile.TemporaryDirectory(prefix="unitrain-ort-") as tmp:
            copy = Path(tmp) / "optimized.onnx"
            self.session = onnx_session(self.path, self.threads, optimized_copy=copy)
            self.kernels = onnx_kernels([n.op_type for n in onnx.load(str(copy)).graph.node])
        self.input_dtype = onnx_input_dtype(self.session)

    def run(self, prepared):
        return run_onnx(self.session, prepared, self.input_dtype)

    def observed(self):
        import onnxruntime as ort

        options = self.session.get_session_options()
        return {
            "providers": self.session.get_providers(),  # the ones the session really uses
            "graph_optimization_level": str(options.graph_optimization_level).split(".")[-1],
            "intra_op_threads": options.intra_op_num_threads,
            "kernels": self.kernels,
            "version": ort.__version__,
        }


def runtimes_for(artifact: artifacts.Artifact, threads: int) -> List[Runtime]:
    if artifact.format == "onnx":
        return [OnnxRuntime(artifact.path, threads)]
    get_backend(artifact.framework).set_threads(threads)
    return infer_module(artifact.framework).runtimes(artifact.path, threads)


# --- the clock --------------------------------------------------------------------------------
def time_runtime(
    runtime: Runtime,
    images: np.ndarray,
    warmup: int,
    min_iters: int,
    min_time_s: float,
    tokens_per_sample: Optional[int] = None,
) -> Dict[str, float]:
    """Latency percentiles and throughput of ``runtime`` on one batch; warm-up not counted. A
    language model's samples are windows of ``tokens_per_sample`` tokens: its throughput in
    tokens/s too (every position's next token is predicted in the one run)."""
    prepared = runtime.prepare(images)
    started = time.perf_counter()
    for _ in range(warmup):
        runtime.run(prepared)
    warmup_s = time.perf_counter() - started
    times: List[float] = []
    begin = time.perf_counter()
    while len(times) < min_iters or (time.perf_counter() - begin < min_time_s and len(times) < 10_000):
        t0 = time.perf_counter()
        runtime.run(prepared)
        times.append(time.perf_counter() - t0)
    ms = np.array(times) * 1e3
    throughput = float(len(images) * len(times) / (ms.sum() / 1e3))
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "iters": len(times),
        "throughput_ips": throughput,
        **({"tokens_per_s": throughput * tokens_per_sample} if tokens_per_sample else {}),
        "warmup_s": round(warmup_s, 3),
    }


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each prediction's loss (nats), in float64: ``logits [..., classes]``, ``labels [...]``."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(-1, keepdims=True)
    log_norm = np.log(np.exp(z).sum(-1))
    return log_norm - np.take_along_axis(z, labels[..., None], -1)[..., 0]


def accuracy(runtime: Runtime, dataset, samples: int, batch: int, fixed: bool) -> Dict[str, float]:
    """Top-1 and mean loss over the first ``samples`` held-out samples, in batches of ``batch``;
    a fixed-batch artifact gets its last batch padded (the padding is not counted). A language
    model's are over every position of its windows (next-token top-1, loss per token)."""
    correct, loss, predictions = 0, 0.0, 0
    for start in range(0, samples, batch):
        indices = list(range(start, min(start + batch, samples)))
        images, labels = artifacts.stack(dataset, indices)
        if fixed and len(indices) < batch:
            images = np.concatenate([images, np.zeros((batch - len(indices), *images.shape[1:]), images.dtype)])
        logits = np.asarray(runtime.run(runtime.prepare(images)))[: len(indices)]
        correct += int((logits.argmax(-1) == labels).sum())
        loss += float(cross_entropy(logits, labels).sum())
        predictions += labels.size
    return {"top1": correct / predictions, "loss": loss / predictions, "samples": samples, "predictions": predictions}


def thread_env(threads: int) -> Dict[str, str]:
    """The environment of a process that runs models: every runtime's OpenMP/MKL pool the same
    size, whichever library reads which variable, and Paddle's C++ log quiet."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "GLOG_minloglevel": "2"}
