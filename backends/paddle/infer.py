"""Inference runtimes in paddle for a ``jit.save`` program: Paddle Inference with and without
its IR/oneDNN optimizations, and ``paddle.jit.load``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import paddle

from unitrain.infer import Runtime


def _prefix(path: Path) -> str:
    return str(path)[: -len(path.suffix)]


class PaddleInference(Runtime):
    def __init__(self, path: Path, threads: int, optimized: bool):
        super().__init__(path, threads)
        self.optimized = optimized
        self.name = "paddle.inference (IR + oneDNN)" if optimized else "paddle.inference (no IR optim)"

    def load(self) -> None:
        from paddle import inference

        prefix = _prefix(self.path)
        config = inference.Config(prefix + ".json", prefix + ".pdiparams")
        config.disable_glog_info()
        config.set_cpu_math_library_num_threads(self.threads)
        config.switch_ir_optim(self.optimized)
        config.enable_onednn() if self.optimized else config.disable_onednn()
        self.predictor = inference.create_predictor(config)
        self.config = config
        self.input = self.predictor.get_input_handle(self.predictor.get_input_names()[0])
        self.output = self.predictor.get_output_handle(self.predictor.get_output_names()[0])

    def prepare(self, images: np.ndarray):
        # Copied into the predictor's input tensor before the clock; each run reuses it.
        self.input.reshape(list(images.shape))
        self.input.copy_from_cpu(np.ascontiguousarray(images, dtype=np.float32))
        return None

    def run(self, prepared) -> np.ndarray:
        self.predictor.run()
        return self.output.copy_to_cpu()

    def observed(self) -> Dict[str, Any]:
        # Read back from the config after the predictor was created, i.e. what Paddle reports it
        # runs with, not what was asked. (Which IR passes fired is in Paddle's own log only.)
        return {
            "ir_optim": self.config.ir_optim(), "onednn": self.config.onednn_enabled(),
            "threads": self.config.cpu_math_library_num_threads(),
        }  # fmt: skip


class PaddleJit(Runtime):
    name = "paddle.jit.load"

    def load(self) -> None:
        paddle.set_device("cpu")
        self.layer = paddle.jit.load(_prefix(self.path))
        self.layer.eval()

    def prepare(self, images: np.ndarray):
        return paddle.to_tensor(np.ascontiguousarray(images, dtype=np.float32))

    def run(self, prepared) -> np.ndarray:
        with paddle.no_grad():
            return self.layer(prepared).numpy()

    def observed(self) -> Dict[str, Any]:
        return {"threads": self.threads}


def runtimes(path: Path, threads: int) -> List[Runtime]:
    return [PaddleInference(path, threads, optimized=True), PaddleInference(path, threads, optimized=False), PaddleJit(path, threads)]
