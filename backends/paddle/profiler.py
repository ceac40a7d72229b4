"""paddle.profiler over the configured step window, exported as a Chrome trace per rank."""

from __future__ import annotations

import re
from pathlib import Path

import paddle
import paddle.profiler as pprof

from unitrain.config import ProfilerConfig
from unitrain.profiler import Tracer

# "conv2d dygraph[8.530 us]" -> "conv2d"
_SUFFIX = re.compile(r"(\[[^\]]*\])$|( dygraph)$")


class PaddleTracer(Tracer):
    op_categories = ("Operator", "Kernel")

    def __init__(self, cfg: ProfilerConfig, path: Path):
        self.path, self.written = path, False
        targets = [pprof.ProfilerTarget.CPU] + ([pprof.ProfilerTarget.GPU] if paddle.is_compiled_with_cuda() else [])
        self.profiler = pprof.Profiler(targets=targets, scheduler=(cfg.start, cfg.start + cfg.steps), on_trace_ready=self._export)

    def normalize(self, name: str) -> str:
        while True:
            stripped = _SUFFIX.sub("", name)
            if stripped == name:
                return name
            name = stripped

    def _export(self, prof) -> None:
        prof.export(str(self.path), format="json")
        self.written = True

    def start(self) -> None:
        self.profiler.start()

    def step(self) -> None:
        self.profiler.step()

    def stop(self) -> Path | None:
        self.profiler.stop()
        return self.path if self.written else None
