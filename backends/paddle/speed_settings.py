"""Paddle at its best on this device. What Paddle documents for speed, and what applies here:

- ``paddle.jit.to_static``: the model's forward runs as a static program (PIR interpreter). On
  GPUs it is applied by default; on the CPU it measured no faster than the dynamic graph
  (benchmarks/README.md, "Each framework's own speed settings"), so it is left out there unless
  named in ``backend.tuned_settings``.
- oneDNN (``FLAGS_use_onednn``): in Paddle 3.3.1 dynamic-graph ops ignore it (their kernel key
  stays plain CPU), and a to_static training program with it on fails in run_program.
- NHWC: Paddle's CPU convolution transposes NHWC to NCHW and back around im2col, so on a CPU
  it only adds work; on a GPU it is the layout Paddle's AMP tables use, but unitrain's Paddle
  ResNets are built NCHW.
- MKL's AVX2 kernels on a CPU that is not Intel's (``mkl_avx2``; blas.py): not in Paddle's
  documentation, but Paddle's bundled MKL 2019 otherwise runs its generic kernels there, and
  its convolutions and matmuls with them. Applied by default on such a CPU with AVX2 and FMA.
"""

from __future__ import annotations

from typing import Dict, List

import paddle

from unitrain.interface.speed_settings import TUNED, SpeedSettings

from . import blas

__all__ = ["Tuned"]


class Tuned(SpeedSettings):
    settings = TUNED
    SETTINGS = {
        "to_static": "paddle.jit.to_static: the forward as one static program",
        "mkl_avx2": "MKL_DEBUG_CPU_TYPE=5: Paddle's MKL 2019 runs its AVX2 kernels on a CPU that is not Intel's",
    }

    def __init__(self, device: str = "cpu", chosen=None):
        super().__init__(device, chosen)
        self._model: paddle.nn.Layer | None = None
        if "mkl_avx2" in self.chosen:
            # Here, before the job's first matmul or convolution: MKL reads it only then.
            blas.force_avx2()

    @staticmethod
    def not_offered(device: str) -> Dict[str, str]:
        always = {
            "oneDNN": (
                "Paddle 3.3.1's dynamic-graph ops ignore FLAGS_use_onednn, and to_static training fails with it on"
            ),
            "NHWC": "Paddle's CPU convolution transposes NHWC to NCHW and back"
            if device == "cpu"
            else "unitrain's Paddle ResNets are built NCHW",
        }
        why_not = "the model trains on a GPU, not in MKL" if device != "cpu" else blas.avx2_not_applicable()
        return {**always, "mkl_avx2": why_not} if why_not else always

    @staticmethod
    def left_out(device: str) -> Dict[str, str]:
        if device == "cpu":
            return {
                "to_static": "measured no faster on a CPU (0.84x-1.00x); name it in backend.tuned_settings to apply it"
            }
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
        applied = [f"paddle.jit.to_static ({traced} program(s) traced)"] if traced else []
        if "mkl_avx2" in self.chosen:
            mkl = blas.code_path()
            if mkl and mkl["detected"] == blas.AVX2:
                applied.append(f"{mkl['library']} AVX2 kernels")
            else:
                # MKL chose before this job asked: an earlier job in this same process.
                self.skipped["mkl_avx2"] = (
                    f"MKL had already chosen its {mkl['code_path'] if mkl else '?'} kernels in this process"
                )
        return applied
