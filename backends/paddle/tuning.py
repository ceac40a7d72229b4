"""Paddle at its best on this device. What Paddle documents for speed, and what applies here:

- ``paddle.jit.to_static``: the model's forward runs as a static program (PIR interpreter). On
  GPUs it is applied by default; on the CPU it was measured slower than the dynamic graph
  (tuned / same-settings samples/s on an AVX2 EPYC, 2026-11-23: ResNet18 32x32 0.97x and 0.91x,
  ResNet50 64x64 1.00x and 0.84x in two runs), so it is left out there unless named in
  ``backend.tuned_settings``.
- oneDNN (``FLAGS_use_onednn``): in Paddle 3.3.1 dynamic-graph ops ignore it (their kernel key
  stays plain CPU), and a to_static training program with it on fails in run_program.
- NHWC: Paddle's CPU convolution transposes NHWC to NCHW and back around im2col, so on a CPU
  it only adds work; on a GPU it is the layout Paddle's AMP tables use, but unitrain's Paddle
  ResNets are built NCHW.
"""

from __future__ import annotations

from typing import Dict, List

import paddle

from unitrain.tuning import TUNED, Tuning


class Tuned(Tuning):
    settings = TUNED
    SETTINGS = {"to_static": "paddle.jit.to_static: the forward as one static program"}

    def __init__(self, device: str = "cpu", chosen=None):
        super().__init__(device, chosen)
        self._model: paddle.nn.Layer | None = None

    @staticmethod
    def not_offered(device: str) -> Dict[str, str]:
        return {
            "oneDNN": "Paddle 3.3.1's dynamic-graph ops ignore FLAGS_use_onednn, and to_static training fails with it on",
            "NHWC": "Paddle's CPU convolution transposes NHWC to NCHW and back" if device == "cpu" else "unitrain's Paddle ResNets are built NCHW",
        }

    @staticmethod
    def left_out(device: str) -> Dict[str, str]:
        if device == "cpu":
            return {"to_static": "measured no faster on a CPU (0.84x-1.00x); name it in backend.tuned_settings to apply it"}
        return {}

    def prepare_model(self, model: paddle.nn.Layer) -> paddle.nn.Layer:
        if "to_static" in self.chosen:
            # full_graph: the AST translator, one program for the whole forward (SOT would fall
            # back to eager at any break without saying so).
            model = paddle.jit.to_static(model, full_graph=True)
        self._model = model
        return model

    def observed(self) -> List[str]:
        forward = getattr(self._model, "forward", None)
        traced = forward.get_traced_count() if hasattr(forward, "get_traced_count") else 0
        return [f"paddle.jit.to_static ({traced} program(s) traced)"] if traced else []
