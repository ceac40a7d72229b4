"""Timer-only profiling and the learning-rate schedules."""

from __future__ import annotations

import time

import pytest

from unitrain.config import OptimConfig
from unitrain.profiler import Profiler
from unitrain.schedule import lr_at


class SlowLoader:
    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __iter__(self):
        for i in range(self.n):
            time.sleep(self.delay)
            yield i


def test_step_times_add_up_to_the_loop_time_and_see_a_slow_reader():
    profiler = Profiler(warmup_steps=0)
    start = time.perf_counter()
    for _ in profiler.timed(SlowLoader(5, 0.02)):
        time.sleep(0.01)
        profiler.step(num_samples=8)
    loop = time.perf_counter() - start
    s = profiler.summary()
    assert sum(t.batch_cost for t in profiler.steps) == pytest.approx(loop, rel=0.05)
    assert s["reader_cost"]["min"] >= 0.02 and 0.5 < s["reader_ratio"] < 0.8
    assert s["ips"]["max"] <= 8 / 0.03
    assert "Reader Ratio" in profiler.format_summary()


def test_warmup_steps_are_left_out_of_the_summary():
    profiler = Profiler(warmup_steps=2)
    for _ in profiler.timed(range(5)):
        profiler.step(1)
    assert profiler.summary()["measured_steps"] == 3 and profiler.summary()["warmup_steps"] == 2


def test_schedules():
    cfg = OptimConfig(lr=1.0, warmup_steps=4, schedule="constant")
    assert [lr_at(s, 10, cfg) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    step = OptimConfig(lr=1.0, schedule="step", step_size=2, gamma=0.5)
    assert [lr_at(s, 10, step) for s in range(5)] == [1.0, 1.0, 0.5, 0.5, 0.25]
    cosine = OptimConfig(lr=1.0, schedule="cosine")
    assert lr_at(0, 10, cosine) == 1.0 and lr_at(5, 10, cosine) == pytest.approx(0.5) and lr_at(10, 10, cosine) == pytest.approx(0.0)
