"""Trainer.train_step against a hand-written step in one process (benchmarks/loop_overhead.py):
what the loop itself adds, free of process-to-process drift."""

from __future__ import annotations

import json
import os
import statistics
import sys
from typing import Dict, List

from ..markdown import ci_text
from ..settings import BENCHMARKS, OVERHEAD_SIZES, Size
from .base import Section, say, with_ci


class Loop(Section):
    def measure(self) -> List[Dict]:
        # Every overhead size, whatever --models says: --models narrows the overhead section alone.
        return [self.row(size, backend) for size in OVERHEAD_SIZES[self.quick] for backend in self.bench.backends]

    def row(self, size: Size, backend: str) -> Dict:
        t = self.times(size, backend)
        pairs = list(zip(t["unitrain"], t["by_hand"]))
        row = {
            "model": size.model,
            "image_size": size.image,
            "backend": backend,
            "steps": len(pairs),
            "unitrain_step_ms": 1e3 * statistics.median(u[0] for u, _ in pairs),
            "by_hand_step_ms": 1e3 * statistics.median(h[0] for _, h in pairs),
            **with_ci("ratio", [u[0] / h[0] for u, h in pairs]),
            **with_ci("cpu_ratio", [u[1] / h[1] for u, h in pairs]),
        }
        say(f"  loop {size.model} {backend}: {ci_text('ratio')(row)}, cpu {ci_text('cpu_ratio')(row)}")
        return row

    def times(self, size: Size, backend: str) -> Dict:
        """loop_overhead.py's (wall, CPU) seconds per step, unitrain's and by hand's."""
        out = self.bench.folder(f"loop_{backend}") / "result.json"
        steps = max(size.steps - size.warmup, 4)
        cmd = [
            *(sys.executable, str(BENCHMARKS / "loop_overhead.py"), "--backend", backend),
            *("--model", size.model, "--image-size", str(size.image), "--steps", str(steps), "--out", str(out)),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
        self.bench.run(cmd, f"loop_overhead {backend}", env=env)
        return json.loads(out.read_text())
