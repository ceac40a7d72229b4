"""The benchmark harness behind benchmarks/run.py, one module per concern: cli (the command line,
--report-only and --combine), session (a measuring run), bench (one job), processes (their
process groups and how they end), machine, results (results.json across runs), markdown
(results.md), and sections/ (one module per section). What it measures: cli.py's docstring."""

from __future__ import annotations

from .bench import Bench
from .cli import main
from .machine import machine
from .processes import Stopped, stop_on_termination
from .settings import OVERHEAD_SIZES, Size

__all__ = ["OVERHEAD_SIZES", "Bench", "Size", "Stopped", "machine", "main", "stop_on_termination"]
