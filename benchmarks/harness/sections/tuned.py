"""Same settings against backend.tuned=true (and each framework setting alone, named in
backend.tuned_settings), interleaved pairs; the speed-up is tuned samples/s over same-settings
samples/s (compilation falls in the warm-up steps)."""

from __future__ import annotations

import statistics
from typing import Dict, List, Tuple

from ..markdown import ci_text
from ..settings import Size
from .base import Section, say, with_ci

# Compilers spend the first steps tracing and compiling: more warm-up left out.
TUNED_SIZES = {True: [Size("tiny", 16, 3, 2)], False: [Size("resnet18", 32, 30, 8), Size("resnet50", 64, 16, 6)]}
# Every setting by name (on a CPU the defaults leave them all out, since they measured no
# faster here: these rows keep measuring them), together and alone.
TUNED_VARIANTS = {
    # --quick checks that the section pairs, runs and reads what each job applied; torch's
    # compile (an Inductor build, most of a cold run's CPU) is tests/test_tuning.py's to check.
    True: [("paddle", "to_static"), ("torch", "channels_last")],
    False: [
        ("paddle", "to_static"),
        ("paddle", "mkl_avx2"),
        ("torch", "compile,channels_last"),
        ("torch", "compile"),
        ("torch", "channels_last"),
    ],
}
SAME = ["backend.tuned=false"]


class Tuned(Section):
    def measure(self) -> List[Dict]:
        wanted = self.bench.tuned_settings
        return [
            self.row(size, backend, variant)
            for size in TUNED_SIZES[self.quick]
            for backend, variant in TUNED_VARIANTS[self.quick]
            if backend in self.bench.backends and variant in (wanted or [variant])
        ]

    def row(self, size: Size, backend: str, variant: str) -> Dict:
        pairs = self.pairs(size, backend, variant)
        row = {
            "model": size.model,
            "image_size": size.image,
            "backend": backend,
            "variant": variant,
            "pairs": len(pairs),
            "same_ips": statistics.median(s["ips"] for s, _ in pairs),
            "tuned_ips": statistics.median(t["ips"] for _, t in pairs),
            **with_ci("speedup", [t["ips"] / s["ips"] for s, t in pairs]),
            "applied": pairs[0][1]["tuning"]["applied"],
            "skipped": pairs[0][1]["tuning"]["skipped"],
        }
        say(f"  {size.model} {size.image}px {backend} {variant}: tuned/same {ci_text('speedup')(row)} {row['applied']}")
        return row

    def pairs(self, size: Size, backend: str, variant: str) -> List[Tuple[Dict, Dict]]:
        """(same settings, tuned) results; which runs first alternates from pair to pair."""
        tuned = ["backend.tuned=true", f"backend.tuned_settings=[{variant}]"]
        pairs = []
        for i in range(self.bench.pairs):
            first, second = (tuned, SAME) if i % 2 else (SAME, tuned)
            a, b = self.bench.unitrain(backend, *first, size=size), self.bench.unitrain(backend, *second, size=size)
            pairs.append((a, b) if i % 2 == 0 else (b, a))
        return pairs
