"""Timer-only profiling and the learning-rate schedules."""

from __future__ import annotations

import time

import pytest

from unitrain.config.schedule import lr_at
from unitrain.config.schema import OptimConfig
from unitrain.train.step_timer import Profiler


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
    assert (
        lr_at(0, 10, cosine) == 1.0
        and lr_at(5, 10, cosine) == pytest.approx(0.5)
        and lr_at(10, 10, cosine) == pytest.approx(0.0)
    )


def _cfg(*overrides):
    from hydra import compose, initialize_config_module

    from unitrain.config.schema import register_configs

    register_configs()
    with initialize_config_module(version_base=None, config_module="unitrain.conf"):
        return compose(config_name="config", overrides=list(overrides))


def test_batch_plan_linear_scaling_keeps_the_per_device_batch():
    from unitrain.config.schedule import BatchPlan

    plan = BatchPlan.from_config(
        _cfg("trainer.batch_size=16", "optim.lr=0.1", "trainer.accumulate_steps=2"), world_size=4
    )
    assert (plan.micro_batch, plan.global_batch, plan.lr) == (16, 128, pytest.approx(0.8))


def test_batch_plan_keep_global_splits_the_batch():
    from unitrain.config.schedule import BatchPlan

    plan = BatchPlan.from_config(
        _cfg("trainer.batch_size=64", "optim.lr=0.1", "optim.lr_scaling=keep_global"), world_size=4
    )
    assert (plan.micro_batch, plan.global_batch, plan.lr) == (16, 64, 0.1)


def test_keep_global_needs_a_divisible_batch():
    from unitrain.errors import ConfigError
    from unitrain.jobs.select import validate

    with pytest.raises(ConfigError, match="trainer.batch_size=10 is not allowed: a multiple of 4"):
        validate(
            _cfg(
                "trainer.batch_size=10",
                "optim.lr_scaling=keep_global",
                "dist.nproc_per_node=2",
                "trainer.accumulate_steps=2",
            )
        )
    with pytest.raises(ConfigError, match="dist.master_port"):
        validate(_cfg("dist.nnodes=2"))
