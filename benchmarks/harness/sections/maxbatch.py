"""The largest batch that fits each backend's job (python -m unitrain.maxbatch), here against a
memory limit standing for a device's memory (on a GPU: its own OOM error)."""

from __future__ import annotations

import json
import sys
from typing import Dict, List

from .base import Section, say

# (model, image size, memory limit, first batch, resolution, largest batch tried) for the
# largest-batch search; --quick stops at its first batch, one trial (a process of its own),
# enough to check the section runs and reads the search's result.
MAXBATCH = {True: ("tiny", 32, "700MiB", 64, 64, 64), False: ("resnet50", 64, "4GiB", 32, 8, 4096)}


class MaxBatch(Section):
    def measure(self) -> List[Dict]:
        return [self.row(backend) for backend in self.bench.backends]

    def row(self, backend: str) -> Dict:
        model, image, limit, _, resolution, _ = MAXBATCH[self.quick]
        result = self.search(backend)
        fitted = [t for t in result["trials"] if t["fits"]]
        say(f"  maxbatch {backend} {model}: {result['max_batch_size']} under {limit}")
        return {
            "backend": backend,
            "model": model,
            "image_size": image,
            "memory_limit_mb": result["memory_limit_mb"],
            "max_batch_size": result["max_batch_size"],
            "resolution": resolution,
            "trials": len(result["trials"]),
            "peak_mb_at_max": max(
                (t["peak_mb"] for t in fitted if t["batch_size"] == result["max_batch_size"]), default=None
            ),
        }

    def search(self, backend: str) -> Dict:
        """unitrain.maxbatch's maxbatch.json for this backend."""
        model, image, limit, start, resolution, largest = MAXBATCH[self.quick]
        out = self.bench.folder(f"maxbatch_{backend}")
        cmd = [
            *(sys.executable, "-m", "unitrain.maxbatch", "--memory-limit", limit, "--start", str(start)),
            *("--resolution", str(resolution), "--max", str(largest), "--out", str(out / "search")),
            *(f"backend={backend}", f"model={model}", f"data.image_size={image}", "trainer.threads=2"),
        ]
        self.bench.run(cmd, f"maxbatch {backend}", cwd=out)
        return json.loads((out / "search" / "maxbatch.json").read_text())
