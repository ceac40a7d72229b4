"""Timer-only step profiling, identical for every backend.

Per step: ``reader_cost`` (seconds waiting for the batch), ``batch_cost`` (seconds for the whole
step, reader included), ``ips`` (samples per second) and ``cpu_cost`` (this process's CPU
seconds in the step, all its threads: it drifts less than wall time on a shared machine, and
above ``batch_cost`` it shows the threads at work). The summary follows the layout of
Paddle's timer_only benchmark summary. The first ``warmup_steps`` steps are measured but left
out of the summary: they hold allocator and kernel-selection warm-up, not steady state.

:class:`Profiler` is this timer (the seed's timer-only profiler, named so in the public API and
the design card): it records no operators. The frameworks' own profilers (``profiler=trace``)
write traces, and are the backends' ``profiler`` modules' (:mod:`unitrain.train.tracing` reads them).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, TypeVar

T = TypeVar("T")


@dataclass
class StepTime:
    reader_cost: float
    batch_cost: float
    num_samples: int
    cpu_cost: float = 0.0

    @property
    def ips(self) -> float:
        return self.num_samples / self.batch_cost if self.batch_cost > 0 else float("inf")

    @property
    def steps_per_s(self) -> float:
        return 1.0 / self.batch_cost if self.batch_cost > 0 else float("inf")


class Profiler:
    """The step timer (timer-only, as Paddle's ``timer_only`` profiler): reader_cost, batch_cost,
    ips and cpu_cost per step and their summary; not a framework's trace (``profiler=trace``)."""

    def __init__(self, warmup_steps: int = 2, enabled: bool = True, history: Iterable[Dict[str, float]] = ()):
        self.warmup_steps, self.enabled = warmup_steps, enabled
        # A resumed run's summary covers every step it keeps, as its metrics.jsonl and clock do:
        # the steps before the checkpoint come from their records, so its throughput is the whole
        # run's (the figure unitrain.compare computes), not only the part since the resume.
        self.steps: List[StepTime] = [
            StepTime(r["reader_cost"], r["batch_cost"], round(r["ips"] * r["batch_cost"]), r.get("cpu_cost", 0.0))
            for r in history
            if enabled and "batch_cost" in r
        ]
        self._reader_cost = 0.0
        self._last: float | None = None
        self._last_cpu = time.process_time()

    def timed(self, loader: Iterable[T]) -> Iterator[T]:
        """Iterate ``loader``, charging the wait for each batch to the next step's reader_cost."""
        if self._last is None:  # the clock runs on across epochs: their hand-over is step time too
            self._last, self._last_cpu = time.perf_counter(), time.process_time()
        start = time.perf_counter()
        iterator = iter(loader)
        # Starting the loader (its threads or worker processes) is waiting for data as well.
        self._reader_cost += time.perf_counter() - start
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            # Summed: with gradient accumulation one step reads several micro-batches.
            self._reader_cost += time.perf_counter() - start
            yield batch

    def restart_clock(self) -> None:
        """Time from here on is the next step's: what ran since the last step (evaluation) is
        neither step time nor reader time, so training throughput stays honest."""
        self._last, self._reader_cost, self._last_cpu = time.perf_counter(), 0.0, time.process_time()

    def step(self, num_samples: int) -> StepTime:
        """Mark the end of a training step that consumed ``num_samples`` samples."""
        now, cpu = time.perf_counter(), time.process_time()
        last = self._last if self._last is not None else now
        record = StepTime(self._reader_cost, now - last, num_samples, cpu - self._last_cpu)
        self._last, self._reader_cost, self._last_cpu = now, 0.0, cpu
        if self.enabled:
            self.steps.append(record)
        return record

    @property
    def measured(self) -> List[StepTime]:
        return self.steps[self.warmup_steps :] or self.steps

    def summary(self) -> Dict[str, Dict[str, float]]:
        """avg/max/min/median of reader_cost, batch_cost, ips; reader_ratio; the total time."""
        steps = self.measured
        if not steps:
            return {}
        out: Dict[str, Dict[str, float] | float] = {}
        for name in ("reader_cost", "batch_cost", "ips", "steps_per_s"):
            values = [getattr(s, name) for s in steps]
            out[name] = {
                "avg": statistics.fmean(values),
                "max": max(values),
                "min": min(values),
                "median": statistics.median(values),
            }
        reader, batch = sum(s.reader_cost for s in steps), sum(s.batch_cost for s in steps)
        out["reader_ratio"] = reader / batch if batch > 0 else 0.0
        out["measured_steps"] = len(steps)
        out["warmup_steps"] = len(self.steps) - len(steps)
        return out

    def format_summary(self) -> str:
        s = self.summary()
        if not s:
            return "no steps measured"
        rows = [
            "=" * 28 + " Perf Summary " + "=" * 28,
            f"Reader Ratio: {100 * s['reader_ratio']:.3f}%",
            "Time Unit: s, IPS Unit: samples/s",
            f"|{'':^17}|{'avg':^17}|{'max':^17}|{'min':^17}|",
        ]
        for name in ("reader_cost", "batch_cost", "ips"):
            v = s[name]
            rows.append(f"|{name:^17}|{v['avg']:^17.5f}|{v['max']:^17.5f}|{v['min']:^17.5f}|")
        return "\n".join(rows)
