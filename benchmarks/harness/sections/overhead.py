"""unitrain's step time against a hand-written native script's: same network, batch, data, threads, steps."""

from __future__ import annotations

import statistics
from typing import Dict, List, Tuple

from ..markdown import ci_text
from ..settings import Size
from .base import Section, say, with_ci

Pair = Tuple[Dict, Dict]


class Overhead(Section):
    def measure(self) -> List[Dict]:
        return [
            self.row(size, backend, world, threads)
            for size in self.bench.overhead_sizes
            for backend in self.bench.backends
            for world, threads in self.bench.layouts
        ]

    def row(self, size: Size, backend: str, world: int, threads: int) -> Dict:
        pairs = self.pairs(size, backend, world, threads)
        row = {
            "model": size.model,
            "image_size": size.image,
            "steps": size.steps,
            "backend": backend,
            "processes": world,
            "threads": threads,
            "pairs": len(pairs),
            "unitrain_step_ms": 1e3 * statistics.median(u["step_s"] for u, _ in pairs),
            "native_step_ms": 1e3 * statistics.median(n["step_s"] for _, n in pairs),
            **with_ci("ratio", [u["step_s"] / n["step_s"] for u, n in pairs]),
            **with_ci("cpu_ratio", [u["cpu_s"] / n["cpu_s"] for u, n in pairs]),
            "unitrain_startup_s": statistics.median(u["startup_s"] for u, _ in pairs),
            "native_startup_s": statistics.median(n["startup_s"] for _, n in pairs),
        }
        say(
            f"  {size.model} {size.image}px {backend} {world}x{threads}: ratio {ci_text('ratio')(row)}, "
            f"cpu {ci_text('cpu_ratio')(row)}"
        )
        return row

    def pairs(self, size: Size, backend: str, world: int, threads: int) -> List[Pair]:
        pairs = []
        for i in range(self.bench.pairs):
            # Which goes first alternates, so that drift over the row falls on both alike.
            pairs.append(self.pair(backend, size, world, threads, native_first=i % 2 == 1))
            # A row of many ResNet50 pairs runs for many minutes: show each pair as it ends.
            say(
                f"    {size.model} {backend} {world}x{threads} pair {i + 1}/{self.bench.pairs}: unitrain "
                f"{1e3 * pairs[-1][0]['step_s']:.0f} ms, native {1e3 * pairs[-1][1]['step_s']:.0f} ms a step"
            )
        return pairs

    def pair(self, backend: str, size: Size, world: int, threads: int, native_first: bool) -> Pair:
        """(unitrain, native) results, run in the order asked for."""
        bench = self.bench
        if native_first:
            native = bench.native(backend, size, world=world, threads=threads)
            return bench.unitrain(backend, world=world, threads=threads, size=size), native
        ours = bench.unitrain(backend, world=world, threads=threads, size=size)
        return ours, bench.native(backend, size, world=world, threads=threads)
