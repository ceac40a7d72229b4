"""torch.profiler over the configured step window, exported as a Chrome trace per rank."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.profiler as tprof

from unitrain.config.schema import ProfilerConfig
from unitrain.interface.profiler import Tracer

__all__ = ["make_tracer"]


class TorchTracer(Tracer):
    op_categories = ("cpu_op", "kernel", "gpu_op")

    def __init__(self, cfg: ProfilerConfig, path: Path):
        super().__init__(path)
        activities = [tprof.ProfilerActivity.CPU] + ([tprof.ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        # Steps [start, start + steps) are recorded: wait until then, one warm-up step if there is room.
        warmup = 1 if cfg.start > 0 else 0
        schedule = tprof.schedule(wait=cfg.start - warmup, warmup=warmup, active=cfg.steps, repeat=1)
        self.profiler = tprof.profile(activities=activities, schedule=schedule, on_trace_ready=self._on_trace_ready)

    def export(self, prof) -> None:
        prof.export_chrome_trace(str(self.path))


def make_tracer(cfg: ProfilerConfig, path: Path) -> TorchTracer:
    return TorchTracer(cfg, path)
