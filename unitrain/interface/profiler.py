"""The framework profiler over a window of steps: what a backend's ``profiler.py`` provides."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, cast

from unitrain.config.schema import ProfilerConfig
from unitrain.interface import modules


class Tracer:
    """The framework profiler over a window of steps (``profiler.mode=trace``); no-op by default.

    A backend's tracer exports a Chrome/Perfetto trace into the run directory and says which
    event categories are operators, so that :mod:`unitrain.tracing` tables them alike.
    """

    #: Trace event categories that are operators, and how to turn an event name into an op name.
    op_categories: tuple = ()

    def __init__(self, path: "Path | None" = None):
        self.path, self.written = path, False
        # paddle.profiler.Profiler and torch.profiler.profile share start/step/stop.
        self.profiler = None

    def normalize(self, name: str) -> str:
        return name

    def export(self, prof) -> None:
        """Write ``prof``'s trace to ``self.path`` (the framework calls this when the window closes)."""

    def _on_trace_ready(self, prof) -> None:
        self.export(prof)
        self.written = True

    def start(self) -> None:
        if self.profiler is not None:
            self.profiler.start()

    def step(self) -> None:
        if self.profiler is not None:
            self.profiler.step()

    def stop(self) -> "Path | None":
        """End profiling; the trace file written, or None when the window was never reached."""
        if self.profiler is not None:
            self.profiler.stop()
        return self.path if self.written else None


class ProfilerModule(Protocol):
    """What ``backends/<name>/profiler.py`` provides."""

    def make_tracer(self, cfg: ProfilerConfig, path: Path) -> Tracer:
        """The framework's profiler over the configured step window, writing a Chrome trace to ``path``."""


def profiler_module(backend: str) -> ProfilerModule:
    return cast(ProfilerModule, modules.load(backend, "profiler"))
