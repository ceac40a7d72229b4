"""paddle.profiler over the configured step window, exported as a Chrome trace per rank."""

from __future__ import annotations

import re
from pathlib import Path

import paddle
import paddle.profiler as pprof

from unitrain.config.schema import ProfilerConfig
from unitrain.interface.profiler import Tracer

__all__ = ["make_tracer"]

# "conv2d dygraph[8.530 us]" -> "conv2d"
_SUFFIX = re.compile(r"(\[[^\]]*\])$|( dygraph)$")


class PaddleTracer(Tracer):
    op_categories = ("Operator", "Kernel")

    def __init__(self, cfg: ProfilerConfig, path: Path):
        super().__init__(path)
        targets = [pprof.ProfilerTarget.CPU] + ([pprof.ProfilerTarget.GPU] if paddle.is_compiled_with_cuda() else [])
        # Steps [start, start + steps) are recorded.
        self.profiler = pprof.Profiler(
            targets=targets, scheduler=(cfg.start, cfg.start + cfg.steps), on_trace_ready=self._on_trace_ready
        )

    def normalize(self, name: str) -> str:
        while True:
            stripped = _SUFFIX.sub("", name)
            if stripped == name:
                return name
            name = stripped

    def export(self, prof) -> None:
        prof.export(str(self.path), format="json")


def make_tracer(cfg: ProfilerConfig, path: Path) -> PaddleTracer:
    return PaddleTracer(cfg, path)
