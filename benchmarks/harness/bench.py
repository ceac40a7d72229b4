"""One measurement: a unitrain job or a hand-written native script, each in a run folder of its own."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Tuple

from .processes import Processes
from .settings import BACKENDS, BENCHMARKS, LAYOUTS, OVERHEAD_SIZES, Size

LAUNCHERS = {"paddle": ["-m", "paddle.distributed.launch"], "torch": ["-m", "torch.distributed.run"]}


class Job(NamedTuple):
    """A unitrain job started and not yet waited for: two can run at once (the scaling ceiling)."""

    proc: subprocess.Popen
    folder: Path
    launched: float
    size: Size
    what: Tuple[str, Tuple[str, ...]]


class Bench:
    """The run's options, and every job it starts (ended as a whole on leaving ``with``)."""

    def __init__(
        self,
        quick: bool,
        repeats: int,
        work: Path,
        pairs: int,
        backends=BACKENDS,
        tuned_settings=None,
        layouts=LAYOUTS,
        models=None,
    ):
        self.work, self.repeats, self.pairs, self.backends = work, repeats, pairs, tuple(backends)
        # The overhead section's (processes, threads) rows: one noisy row can get more pairs alone.
        self.layouts = tuple(layouts)
        self.overhead_sizes = [s for s in OVERHEAD_SIZES[quick] if models is None or s.model in models]
        # The tuned section's variants to measure (as backend.tuned_settings spells them); None: all.
        self.tuned_settings = tuned_settings
        # --quick at 32x32: at 16x16 the tiny ResNet's layer4 sees one pixel, where torch's oneDNN bf16
        # convolution backward gives NaN gradients at random on AVX-512 CPUs (benchmarks/README.md, "oneDNN bf16 NaN").
        # Its 3 steps (1 of warm-up) are what checking a row needs: beside other work, each step of a
        # 2-thread job costs most of a CPU second, and --quick starts dozens of jobs.
        self.size = Size("tiny", 32, 3, 1) if quick else Size("resnet18", 32, 30, 5)
        self.batch = 16
        self.quick = quick
        self.runs = 0
        self.processes = Processes()

    def __enter__(self) -> "Bench":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, grace_s: float = 10.0) -> None:
        self.processes.stop(grace_s)

    def folder(self, name: str) -> Path:
        """A new run folder, numbered in the order the runs started."""
        self.runs += 1
        d = self.work / f"{self.runs:03d}_{name}"
        d.mkdir(parents=True)
        return d

    def run(self, cmd: List[str], what: str, **kw) -> str:
        return self.processes.run(cmd, what, **kw)

    def unitrain(
        self, backend: str, *overrides: str, world: int = 1, threads: int = 2, size: Size | None = None
    ) -> Dict[str, float]:
        return self.result(self.start(backend, *overrides, world=world, threads=threads, size=size))

    def start(self, backend: str, *overrides: str, world: int = 1, threads: int = 2, size: Size | None = None) -> Job:
        size = size or self.size
        d = self.folder(f"unitrain_{backend}")
        common = [
            f"backend={backend}",
            f"model={size.model}",
            f"data.image_size={size.image}",
            f"trainer.steps={size.steps}",
            f"trainer.batch_size={self.batch}",
            f"trainer.threads={threads}",
            f"dist.nproc_per_node={world}",
            "trainer.progress=false",
            f"profiler.warmup_steps={size.warmup}",
            "optim.lr=0.02",
        ]
        launched = time.time()
        proc = self.processes.spawn([sys.executable, "-m", "unitrain", *common, *overrides, f"hydra.run.dir={d}"])
        return Job(proc, d, launched, size, (backend, overrides))

    def result(self, job: Job) -> Dict[str, float]:
        self.processes.finish(job.proc, f"unitrain {job.what}")
        summary = json.loads((job.folder / "summary.json").read_text())
        records = [json.loads(line) for line in (job.folder / "metrics.jsonl").read_text().splitlines()]
        records = [r for r in records if "batch_cost" in r]
        return {
            "step_s": median_step([r["batch_cost"] for r in records], job.size),
            "cpu_s": median_step([r["cpu_cost"] for r in records], job.size),
            "startup_s": summary["loop_started_at"] - job.launched,
            "ips": summary["throughput"]["samples_per_s"],
            "reader_ratio": summary["profiler"]["reader_ratio"],
            "effective": summary["precision"]["effective"],
            "tuning": summary.get("tuning"),
            "grad_sync": summary.get("grad_sync"),
            "val_top1": (summary.get("eval") or {}).get("val_top1"),
        }

    def native(
        self, backend: str, size: Size, world: int = 1, threads: int = 2, env: Dict[str, str] | None = None
    ) -> Dict[str, float]:
        d = self.folder(f"native_{backend}")
        cmd = self._native_command(backend, size, world, threads, d)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), **(env or {})}
        launched = time.time()
        self.run(cmd, f"native {backend} x{world}", env=env, cwd=d)
        result = json.loads((d / "result.json").read_text())
        step = median_step(result["step_times"], size)
        return {
            "step_s": step,
            "cpu_s": median_step(result["cpu_times"], size),
            "startup_s": result["loop_started_at"] - launched,
            "ips": self.batch * world / step,
        }

    def _native_command(self, backend: str, size: Size, world: int, threads: int, d: Path) -> List[str]:
        script = BENCHMARKS / f"native_{backend}.py"
        args = [
            *("--model", size.model, "--image-size", str(size.image), "--steps", str(size.steps)),
            *("--batch-size", str(self.batch), "--threads", str(threads), "--out", str(d / "result.json")),
        ]
        if world == 1:
            return [sys.executable, str(script), *args]
        logs = ["--log_dir", str(d / "logs")] if backend == "paddle" else []
        return [sys.executable, *LAUNCHERS[backend], "--nproc_per_node", str(world), *logs, str(script), *args]


def median_step(times: List[float], size: Size) -> float:
    return statistics.median(times[size.warmup :] or times)
