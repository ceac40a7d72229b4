"""Arguments and result file shared by the hand-written native baselines.

The baselines borrow only what must be identical for a fair comparison: the ResNet classes
(so the model is the same) and the NumPy datasets (so the data is the same). Loop, sampler,
loader, optimizer and data-parallel wrapping are each framework's own, as in its tutorials.
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
    """Per-step wall time, data wait included: the same definition as unitrain's batch_cost."""

    def __init__(self):
        self.loop_started_at = time.time()
        self.last = time.perf_counter()
        self.step_times = []

    def step(self) -> None:
        now = time.perf_counter()
        self.step_times.append(now - self.last)
        self.last = now

    def write(self, path: str, **extra) -> None:
        with open(path, "w") as f:
            json.dump({"step_times": self.step_times, "loop_started_at": self.loop_started_at, **extra}, f)
