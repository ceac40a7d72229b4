"""2 processes x 1 thread against 1 x 1, with the frameworks' all-reduce levers, and the ceiling:
two independent 1 x 1 jobs at once (no communication), which shows how much of the loss is the
all-reduce and how much the machine (shared caches, memory bandwidth)."""

from __future__ import annotations

import statistics
from typing import Dict, List

from ..markdown import spread_text
from .base import Section, say, with_spread

#: --quick checks that the section runs and reads each job's all-reduce, so it measures no lever:
#: each is two more 2-process jobs per framework, and tests/test_tuning.py checks the levers.
SCALING_BUCKETS = {True: (), False: (5, 100)}
#: Its runs are two 1 x 1 jobs at once, not one job's overrides.
CEILING = "no all-reduce (2 independent jobs)"
TUNED_ON = "backend.tuned=true"


class Scaling(Section):
    def measure(self) -> List[Dict]:
        return [row for backend in self.bench.backends for row in BackendScaling(self, backend).rows()]


class BackendScaling:
    """One backend's rows: each variant's 2 x 1 runs against the 1 x 1 runs of the same repeats."""

    def __init__(self, section: Scaling, backend: str):
        self.bench, self.backend = section.bench, backend
        self.variants = {CEILING: None, "default": []}
        self.variants.update(
            {f"bucket_cap_mb={mb}": [f"dist.bucket_cap_mb={mb}"] for mb in SCALING_BUCKETS[section.quick]}
        )
        if backend == "torch" and not section.quick:
            self.variants["grad_compression=fp16"] = ["dist.grad_compression=fp16"]
        self.runs: Dict[str, List[Dict]] = {name: [] for name in self.variants}
        self.one: List[Dict] = []
        # Each framework at its best scales from its own tuned 1 x 1, measured only where
        # backend.tuned applies something on this machine (say MKL's AVX2 kernels for Paddle
        # on an AMD CPU): elsewhere it is the default row again.
        self.tuned_one: List[Dict] = []
        self.tuned_name: str | None = None

    def rows(self) -> List[Dict]:
        for repeat in range(self.bench.repeats):
            self.one.append(self.bench.unitrain(self.backend, world=1, threads=1))
            for name, overrides in self.variants.items():
                self.runs[name].append(self.two_processes(overrides))
            if repeat == 0 or self.tuned_name:
                self.tuned(first=repeat == 0)
        return [self.row(name, rs) for name, rs in self.runs.items()]

    def two_processes(self, overrides: List[str] | None) -> Dict:
        """A 2 x 1 job's result; for the ceiling (None), two 1 x 1 jobs at once, their samples/s added."""
        if overrides is not None:
            return self.bench.unitrain(self.backend, *overrides, world=2, threads=1)
        jobs = [self.bench.start(self.backend, world=1, threads=1) for _ in range(2)]
        results = [self.bench.result(job) for job in jobs]
        return {"ips": sum(r["ips"] for r in results), "grad_sync": None}

    def tuned(self, first: bool) -> None:
        alone = self.bench.unitrain(self.backend, TUNED_ON, world=1, threads=1)
        if first and alone["tuning"]["applied"]:
            self.tuned_name = f"{TUNED_ON} ({', '.join(alone['tuning']['applied'])})"
            self.runs[self.tuned_name] = []
        if self.tuned_name:
            self.tuned_one.append(alone)
            self.runs[self.tuned_name].append(self.bench.unitrain(self.backend, TUNED_ON, world=2, threads=1))

    def row(self, name: str, rs: List[Dict]) -> Dict:
        base = self.tuned_one if name == self.tuned_name else self.one
        sync = rs[0]["grad_sync"] or {}
        row = {
            "backend": self.backend,
            "variant": name,
            "ips_1x1": statistics.median(o["ips"] for o in base),
            "ips_2x1": statistics.median(r["ips"] for r in rs),
            **with_spread("efficiency", [r["ips"] / (2 * o["ips"]) for o, r in zip(base, rs)]),
            "buckets": sync.get("bucket_mb"),
            "comm_hook": sync.get("comm_hook"),
        }
        say(f"  {self.backend} {name}: efficiency {spread_text('efficiency', 2)(row)}")
        return row
