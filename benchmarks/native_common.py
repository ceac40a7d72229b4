"""Arguments and result file shared by the hand-written native baselines.

The baselines borrow from unitrain only the NumPy dataset (so the data is the same). Model,
loop, sampler, loader, optimizer and data-parallel wrapping are each framework's own, as in its
tutorials: Paddle's model is ``paddle.vision.models``, torch's a torchvision ResNet written out.
"""

from __future__ import annotations

import argparse
import json
import time


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--out", required=True)
    return p.parse_args()


class StepTimer:
    """Per-step wall time, data wait included (the same definition as unitrain's batch_cost), and
    the process's CPU time per step, all threads (unitrain's cpu_cost)."""

    def __init__(self):
        self.loop_started_at = time.time()
        self.last, self.last_cpu = time.perf_counter(), time.process_time()
        self.step_times, self.cpu_times = [], []

    def step(self) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        self.step_times.append(now - self.last)
        self.cpu_times.append(cpu - self.last_cpu)
        self.last, self.last_cpu = now, cpu

    def write(self, path: str, **extra) -> None:
        with open(path, "w") as f:
            json.dump(
                {
                    "step_times": self.step_times,
                    "cpu_times": self.cpu_times,
                    "loop_started_at": self.loop_started_at,
                    **extra,
                },
                f,
            )
