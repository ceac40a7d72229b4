"""Samples/s for O0-O3 (bfloat16) per backend, and the precision that really ran."""

from __future__ import annotations

import statistics
from typing import Dict, List

from .base import Section, with_spread

# --quick checks that the section runs and writes its rows, so it measures fewer levels.
AMP_LEVELS = {True: ("O0", "O2"), False: ("O0", "O1", "O2", "O3")}


class Amp(Section):
    def measure(self) -> List[Dict]:
        rows = []
        for backend in self.bench.backends:
            base = None
            for level in AMP_LEVELS[self.quick]:
                rows.append(self.row(backend, level, base))
                base = base or rows[-1]["ips"]
        return rows

    def row(self, backend: str, level: str, base: float | None) -> Dict:
        """``base``: the first level's samples/s (None for the first level itself)."""
        runs = [self.bench.unitrain(backend, f"amp={level}", "amp.dtype=bfloat16") for _ in range(self.bench.repeats)]
        ips = statistics.median(r["ips"] for r in runs)
        return {
            "backend": backend,
            "amp": level,
            "effective": runs[0]["effective"],
            **with_spread("ips", [r["ips"] for r in runs]),
            "vs_O0": ips / (base or ips),
        }
