"""The paddle Backend: the framework primitives the training loop needs (threads, seeds, the loss,
state as NumPy, hooks on layer outputs)."""

from __future__ import annotations

import math
import random

import numpy as np
import paddle
import paddle.nn.functional as F

from unitrain.interface.backend import Backend, check_state

from . import blas

__all__ = ["create_backend"]


class PaddleBackend(Backend):
    name = "paddle"
    package = "paddlepaddle"

    def __init__(self):
        # Paddle has no getter for its CPU math-library threads; remember what was set.
        self._threads: int | None = None

    def version(self) -> str:
        return paddle.__version__

    def describe(self):
        # The kernels Paddle's MKL ran, observed: on a CPU that is not Intel's they are its
        # generic ones unless backend.tuned asked for AVX2 (blas.py). Read at the end of a job,
        # since asking fixes MKL's choice.
        mkl = blas.code_path()
        if not mkl:
            return super().describe()
        kernels = f"{mkl['library']}, {mkl['code_path']} kernels"
        described = {**super().describe(), "blas": kernels}
        if mkl["code_path"] == "generic":
            described["speed_warnings"] = [
                f"paddle ran {kernels}: its MKL chooses by CPU vendor and leaves a CPU that is not Intel's on them, "
                "so Paddle's convolutions and matmuls ran below this CPU's speed; backend.tuned=true runs MKL's AVX2 "
                "kernels (benchmarks/README.md: Paddle's MKL on AMD CPUs)"
            ]
        return described

    def set_threads(self, threads: int) -> None:
        paddle.base.core.set_num_threads(threads)
        self._threads = threads

    def threads(self) -> int:
        return self._threads or 0

    def seed(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        paddle.seed(seed)

    def loss(self, logits, labels, label_smoothing: float = 0.0):
        # A language model's [batch, time, vocab] logits: every position is a prediction.
        logits = _float32(logits.reshape([-1, logits.shape[-1]]))
        return F.cross_entropy(logits, labels.reshape([-1]), label_smoothing=label_smoothing)

    def to_numpy(self, tensor):
        return _float32(tensor.detach()).numpy()

    def num_parameters(self, model) -> int:
        # Paddle keeps BatchNorm running statistics as parameters with stop_gradient set;
        # count trainable ones only, as torch (where they are buffers) does.
        return sum(math.prod(p.shape) for p in model.parameters() if not p.stop_gradient)

    def state_arrays(self, model):
        return {name: t.numpy().copy() for name, t in model.state_dict().items()}

    def load_state_arrays(self, model, arrays) -> None:
        state = model.state_dict()
        check_state(state.keys(), {k: tuple(v.shape) for k, v in state.items()}, arrays)
        model.set_state_dict({k: np.ascontiguousarray(v) for k, v in arrays.items()})

    def set_deterministic(self) -> dict:
        # The CPU build has no such flag (and no cuDNN); its CPU kernels gave identical
        # results run after run at a fixed thread count here.
        if not paddle.is_compiled_with_cuda():
            return {"FLAGS_cudnn_deterministic": "n/a (CPU build)", "threads": self.threads()}
        paddle.set_flags({"FLAGS_cudnn_deterministic": True})
        return {"FLAGS_cudnn_deterministic": True, "threads": self.threads()}

    def _leaf_layers(self, model):
        return [(name, layer) for name, layer in model.named_sublayers() if not layer.sublayers()]

    def _on_output(self, layer, callback):
        return layer.register_forward_post_hook(lambda layer, inputs, output: callback(output))

    def save_training_state(self, path, optimizer, extra) -> None:
        rng = {"python": random.getstate(), "numpy": np.random.get_state(), "paddle": paddle.get_rng_state()}
        paddle.save({"optimizer": optimizer.state_dict(), "rng": rng, "extra": extra}, str(path))

    def load_training_state(self, path, optimizer):
        state = paddle.load(str(path))
        optimizer.set_state_dict(state["optimizer"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        paddle.set_rng_state(state["rng"]["paddle"])
        return state["extra"]

    def parameter_arrays(self, model):
        return {name: p.astype("float32").numpy() for name, p in model.named_parameters() if not p.stop_gradient}

    def peak_device_memory_mb(self, device: str) -> float | None:
        return paddle.device.cuda.max_memory_allocated(device) / 2**20 if device.startswith("gpu") else None

    def freeze_batchnorm(self, model) -> None:
        for m in model.sublayers():
            if isinstance(m, paddle.nn.layer.norm._BatchNormBase):
                m.eval()


def create_backend() -> PaddleBackend:
    return PaddleBackend()


def _float32(tensor):
    # Cast only what is not float32 already: Paddle's astype copies (and its backward runs) even
    # to the same dtype, for every step's logits.
    return tensor if tensor.dtype == paddle.float32 else tensor.astype("float32")
