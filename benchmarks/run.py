"""unitrain's benchmark harness: measured side by side, in one run, on this machine.

    python benchmarks/run.py [--quick] [--repeats N] [--out benchmarks/results]

Sections (each a table in results.md, all numbers in results.json):
  overhead  unitrain's median step time / a hand-written native script's (plain torch DDP with
            its own torchvision ResNet, plain Paddle Fleet with paddle.vision.models), same
            network, batch, data, threads, steps; 1 x 2 and 2 x 1 processes x threads; ResNet18
            at 32x32 and ResNet50 at 64x64; wall and CPU time per step, median ratio over pairs
            with a bootstrap 95% confidence interval
  loop      Trainer.train_step against a hand-written step, alternating in one process on the
            same model and batches (benchmarks/loop_overhead.py): the loop's own cost
  startup   seconds from launching the command to the first training step, same pairs
  data      reader ratio and samples/s against loader workers (0, 1, 2), synthetic and
            imagefolder data
  scaling   2 processes x 1 thread against 1 process x 1 thread: efficiency = ips2 / (2 ips1),
            with the frameworks' all-reduce levers (bucket sizes; torch's fp16 compression),
            the ceiling of two independent jobs at once, and each framework at its best
            (backend.tuned=true, from its own tuned 1 x 1) where that applies anything here
  compression  held-out top-1 with and without fp16 gradient compression (torch, 2 x 1)
  maxbatch  the largest batch each backend's ResNet50 job fits under a memory limit (unitrain.maxbatch)
  tuned     backend.tuned=true against the same settings (torch.compile + channels-last;
            Paddle's to_static and its MKL's AVX2 kernels), interleaved pairs, with what each
            framework reported it did
  amp       samples/s for O0-O3 (bfloat16) per backend, and the precision that really ran
Runs of a pair alternate, and which goes first alternates from pair to pair, so that drift hits
both alike; every figure is a median over repeats with its spread. Timings are never asserted
by the test suite; it only checks that --quick runs and writes its files.

Nothing measured is lost: each section is written (results.json, results.md, results.png) as it
ends; a run of some sections or backends keeps the rows --out already held for the others, each
row stamped with the run that measured it; a section whose command fails is logged in
failed_<section>.log and the others go on (exit status 1); Ctrl-C or SIGTERM ends every command
started and keeps the finished sections. --report-only draws results.md and results.png again;
--combine DIR... makes one report from rows measured in separate runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Tuple

import numpy as np

from unitrain.host.atomic import replace_text
from unitrain.host.machine import FLAGS
from unitrain.host.machine import cpu as cpu_info
from unitrain.launch.arguments import OneLineParser
from unitrain.report.intervals import median_ci

HERE = Path(__file__).resolve().parent
BACKENDS = ("paddle", "torch")
SECTIONS = ("overhead", "loop", "data", "scaling", "compression", "tuned", "maxbatch", "amp")
LAUNCHERS = {"paddle": ["-m", "paddle.distributed.launch"], "torch": ["-m", "torch.distributed.run"]}


class Size(NamedTuple):
    model: str
    image: int
    steps: int
    warmup: int


#: The overhead section's networks: the natives build their own, so no "tiny" there. ResNet50 at
#: 64x64 is the product's model; 12 steps as in the issue that measured the gap (0.2 s a step).
#: vit_small is the transformer family's benchmark size.
OVERHEAD_SIZES = {
    True: [Size("resnet18", 16, 6, 2)],
    False: [Size("resnet18", 32, 30, 5), Size("resnet50", 64, 12, 2), Size("vit_small", 32, 30, 5)],
}
#: (processes, threads) on 2 cores, as --layouts spells them.
LAYOUTS = ((1, 2), (2, 1))
SCALING_BUCKETS = {True: (5,), False: (5, 100)}
# Compilers spend the first steps tracing and compiling: more warm-up left out.
TUNED_SIZES = {True: [Size("tiny", 16, 6, 3)], False: [Size("resnet18", 32, 30, 8), Size("resnet50", 64, 16, 6)]}
# (model, image size, memory limit, first batch, resolution, largest batch tried) for the
# largest-batch search; --quick stops at 128, two trials, enough to check the section runs.
MAXBATCH = {True: ("tiny", 32, "700MiB", 64, 64, 128), False: ("resnet50", 64, "4GiB", 32, 8, 4096)}
# --quick checks that a section runs and writes its rows, so it measures fewer variants.
DATA_WORKERS = {True: (0, 2), False: (0, 1, 2)}
AMP_LEVELS = {True: ("O0", "O2"), False: ("O0", "O1", "O2", "O3")}
# Every setting by name (on a CPU the defaults leave them all out, since they measured no
# faster here: these rows keep measuring them), together and alone.
TUNED_VARIANTS = {
    True: [("paddle", "to_static"), ("torch", "compile,channels_last")],
    False: [
        ("paddle", "to_static"),
        ("paddle", "mkl_avx2"),
        ("torch", "compile,channels_last"),
        ("torch", "compile"),
        ("torch", "channels_last"),
    ],
}


class Bench:
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
        self.size = Size("tiny", 32, 8, 2) if quick else Size("resnet18", 32, 30, 5)
        self.batch = 16
        self.quick = quick
        self.runs = 0
        # Every command still running, so that an interrupted benchmark leaves none behind.
        self.live: Dict[int, subprocess.Popen] = {}

    # --- one measurement -----------------------------------------------------------------------
    def _dir(self, name: str) -> Path:
        self.runs += 1
        d = self.work / f"{self.runs:03d}_{name}"
        d.mkdir(parents=True)
        return d

    def _spawn(self, cmd: List[str], **kw) -> subprocess.Popen:
        """Start a command in a process group of its own (its launcher's workers with it), which
        stop() ends as a whole; Ctrl-C at the terminal then reaches only this harness."""
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw
        )
        self.live[proc.pid] = proc
        return proc

    def _finish(self, proc: subprocess.Popen, what: str) -> str:
        """Wait for a command; its stdout, or RuntimeError with the end of its stderr."""
        out, err = proc.communicate()
        self.live.pop(proc.pid, None)
        if proc.returncode != 0:
            last = next((line.strip() for line in reversed(err.splitlines()) if line.strip()), "no error output")
            raise RuntimeError(f"{what} failed (exit status {proc.returncode}): {last}\n{err[-3000:]}")
        return out

    def _run(self, cmd: List[str], what: str, **kw) -> str:
        return self._finish(self._spawn(cmd, **kw), what)

    def __enter__(self) -> "Bench":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, grace_s: float = 10.0) -> None:
        """End every command still running: SIGTERM to its group (unitrain then stops its own
        workers and says so), SIGKILL to what is left after ``grace_s``."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            for proc in self.live.values():
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            for proc in list(self.live.values()):
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    continue
            # A launcher's workers can outlive it in its group: the group, not the leader, decides.
            self.live = {pid: p for pid, p in self.live.items() if _group_alive(pid)}
            if not self.live:
                return

    @staticmethod
    def _median_step(times: List[float], size: Size) -> float:
        return statistics.median(times[size.warmup :] or times)

    def unitrain(
        self, backend: str, *overrides: str, world: int = 1, threads: int = 2, size: Size | None = None
    ) -> Dict[str, float]:
        return self._result(self._start(backend, *overrides, world=world, threads=threads, size=size))

    def _start(self, backend: str, *overrides: str, world: int = 1, threads: int = 2, size: Size | None = None):
        size = size or self.size
        d = self._dir(f"unitrain_{backend}")
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
        proc = self._spawn([sys.executable, "-m", "unitrain", *common, *overrides, f"hydra.run.dir={d}"])
        return proc, d, launched, size, (backend, overrides)

    def _result(self, started) -> Dict[str, float]:
        proc, d, launched, size, what = started
        self._finish(proc, f"unitrain {what}")
        summary = json.loads((d / "summary.json").read_text())
        records = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        records = [r for r in records if "batch_cost" in r]
        return {
            "step_s": self._median_step([r["batch_cost"] for r in records], size),
            "cpu_s": self._median_step([r["cpu_cost"] for r in records], size),
            "startup_s": summary["loop_started_at"] - launched,
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
        d = self._dir(f"native_{backend}")
        script = HERE / f"native_{backend}.py"
        args = [
            "--model",
            size.model,
            "--image-size",
            str(size.image),
            "--steps",
            str(size.steps),
            "--batch-size",
            str(self.batch),
            "--threads",
            str(threads),
            "--out",
            str(d / "result.json"),
        ]
        if world == 1:
            cmd = [sys.executable, str(script), *args]
        else:
            logs = ["--log_dir", str(d / "logs")] if backend == "paddle" else []
            cmd = [sys.executable, *LAUNCHERS[backend], "--nproc_per_node", str(world), *logs, str(script), *args]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), **(env or {})}
        launched = time.time()
        self._run(cmd, f"native {backend} x{world}", env=env, cwd=d)
        result = json.loads((d / "result.json").read_text())
        step = self._median_step(result["step_times"], size)
        return {
            "step_s": step,
            "cpu_s": self._median_step(result["cpu_times"], size),
            "startup_s": result["loop_started_at"] - launched,
            "ips": self.batch * world / step,
        }

    # --- sections ------------------------------------------------------------------------------
    def _pair(self, backend: str, size: Size, world: int, threads: int, native_first: bool) -> Tuple[Dict, Dict]:
        """(unitrain, native) results, run in the order asked for."""
        if native_first:
            native = self.native(backend, size, world=world, threads=threads)
            return self.unitrain(backend, world=world, threads=threads, size=size), native
        ours = self.unitrain(backend, world=world, threads=threads, size=size)
        return ours, self.native(backend, size, world=world, threads=threads)

    def overhead(self) -> List[Dict]:
        rows = []
        for size in self.overhead_sizes:
            for backend in self.backends:
                for world, threads in self.layouts:
                    pairs = []
                    for i in range(self.pairs):
                        pairs.append(self._pair(backend, size, world, threads, native_first=i % 2 == 1))
                        # A row of many ResNet50 pairs runs for many minutes: show each pair as it ends.
                        print(
                            f"    {size.model} {backend} {world}x{threads} pair {i + 1}/{self.pairs}: unitrain "
                            f"{1e3 * pairs[-1][0]['step_s']:.0f} ms, native {1e3 * pairs[-1][1]['step_s']:.0f} ms a "
                            "step",
                            flush=True,
                        )
                    ratio, low, high = median_ci([u["step_s"] / n["step_s"] for u, n in pairs])
                    cpu_ratio, cpu_low, cpu_high = median_ci([u["cpu_s"] / n["cpu_s"] for u, n in pairs])
                    rows.append(
                        {
                            "model": size.model,
                            "image_size": size.image,
                            "steps": size.steps,
                            "backend": backend,
                            "processes": world,
                            "threads": threads,
                            "pairs": len(pairs),
                            "unitrain_step_ms": 1e3 * statistics.median(u["step_s"] for u, _ in pairs),
                            "native_step_ms": 1e3 * statistics.median(n["step_s"] for _, n in pairs),
                            "ratio": ratio,
                            "ratio_ci": [low, high],
                            "cpu_ratio": cpu_ratio,
                            "cpu_ratio_ci": [cpu_low, cpu_high],
                            "unitrain_startup_s": statistics.median(u["startup_s"] for u, _ in pairs),
                            "native_startup_s": statistics.median(n["startup_s"] for _, n in pairs),
                        }
                    )
                    print(
                        f"  {size.model} {size.image}px {backend} {world}x{threads}: ratio {ratio:.3f} [{low:.3f}, "
                        f"{high:.3f}], "
                        f"cpu {cpu_ratio:.3f} [{cpu_low:.3f}, {cpu_high:.3f}]",
                        flush=True,
                    )
        return rows

    def loop(self) -> List[Dict]:
        """Trainer.train_step against a hand-written step in one process (benchmarks/loop_overhead.py):
        what the loop itself adds, free of process-to-process drift."""
        rows = []
        for size in OVERHEAD_SIZES[self.quick]:
            for backend in self.backends:
                out = self._dir(f"loop_{backend}") / "result.json"
                steps = max(size.steps - size.warmup, 4)
                cmd = [
                    sys.executable,
                    str(HERE / "loop_overhead.py"),
                    "--backend",
                    backend,
                    "--model",
                    size.model,
                    "--image-size",
                    str(size.image),
                    "--steps",
                    str(steps),
                    "--out",
                    str(out),
                ]
                self._run(
                    cmd, f"loop_overhead {backend}", env={**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
                )
                t = json.loads(out.read_text())
                pairs = list(zip(t["unitrain"], t["by_hand"]))
                ratio, low, high = median_ci([u[0] / h[0] for u, h in pairs])
                cpu, cpu_low, cpu_high = median_ci([u[1] / h[1] for u, h in pairs])
                rows.append(
                    {
                        "model": size.model,
                        "image_size": size.image,
                        "backend": backend,
                        "steps": len(pairs),
                        "unitrain_step_ms": 1e3 * statistics.median(u[0] for u, _ in pairs),
                        "by_hand_step_ms": 1e3 * statistics.median(h[0] for _, h in pairs),
                        "ratio": ratio,
                        "ratio_ci": [low, high],
                        "cpu_ratio": cpu,
                        "cpu_ratio_ci": [cpu_low, cpu_high],
                    }
                )
                print(
                    f"  loop {size.model} {backend}: {ratio:.3f} [{low:.3f}, {high:.3f}], cpu {cpu:.3f} "
                    f"[{cpu_low:.3f}, {cpu_high:.3f}]",
                    flush=True,
                )
        return rows

    def data(self) -> List[Dict]:
        folder = self.work / "imagefolder"
        if not folder.exists():
            from PIL import Image

            rng = np.random.default_rng(0)
            for cls in ("a", "b"):
                (folder / cls).mkdir(parents=True)
                for i in range(self.size.steps * self.batch // 2 + self.batch):
                    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(folder / cls / f"{i}.png")
        rows = []
        for backend in self.backends:
            for data in ("synthetic", "imagefolder"):
                extra = [f"data.path={folder}"] if data == "imagefolder" else []
                for workers in DATA_WORKERS[self.quick]:
                    runs = [
                        self.unitrain(backend, f"data={data}", f"data.num_workers={workers}", *extra)
                        for _ in range(self.repeats)
                    ]
                    ratios = [r["reader_ratio"] for r in runs]
                    rows.append(
                        {
                            "backend": backend,
                            "data": data,
                            "workers": workers,
                            "reader_ratio": statistics.median(ratios),
                            "reader_ratio_max": max(ratios),
                            "ips": statistics.median(r["ips"] for r in runs),
                        }
                    )
        return rows

    def scaling(self) -> List[Dict]:
        """2 processes x 1 thread against 1 x 1, with the frameworks' all-reduce levers, and the
        ceiling: two independent 1 x 1 jobs at once (no communication), which shows how much of
        the loss is the all-reduce and how much the machine (shared caches, memory bandwidth)."""
        rows = []
        for backend in self.backends:
            variants = {"no all-reduce (2 independent jobs)": None, "default": []}
            variants.update({f"bucket_cap_mb={mb}": [f"dist.bucket_cap_mb={mb}"] for mb in SCALING_BUCKETS[self.quick]})
            if backend == "torch":
                variants["grad_compression=fp16"] = ["dist.grad_compression=fp16"]
            runs: Dict[str, List[Dict]] = {name: [] for name in variants}
            one = []
            # Each framework at its best scales from its own tuned 1 x 1, measured only where
            # backend.tuned applies something on this machine (say MKL's AVX2 kernels for Paddle
            # on an AMD CPU): elsewhere it is the default row again.
            tuned_one, tuned_name = [], None
            for repeat in range(self.repeats):
                one.append(self.unitrain(backend, world=1, threads=1))
                for name, overrides in variants.items():
                    if overrides is None:
                        jobs = [self._start(backend, world=1, threads=1) for _ in range(2)]
                        results = [self._result(job) for job in jobs]
                        runs[name].append({"ips": sum(r["ips"] for r in results), "grad_sync": None})
                    else:
                        runs[name].append(self.unitrain(backend, *overrides, world=2, threads=1))
                if repeat == 0 or tuned_name:
                    alone = self.unitrain(backend, "backend.tuned=true", world=1, threads=1)
                    if repeat == 0 and alone["tuning"]["applied"]:
                        tuned_name = f"backend.tuned=true ({', '.join(alone['tuning']['applied'])})"
                        runs[tuned_name] = []
                    if tuned_name:
                        tuned_one.append(alone)
                        runs[tuned_name].append(self.unitrain(backend, "backend.tuned=true", world=2, threads=1))
            for name, rs in runs.items():
                base = tuned_one if name == tuned_name else one
                effs = [r["ips"] / (2 * o["ips"]) for o, r in zip(base, rs)]
                sync = rs[0]["grad_sync"] or {}
                rows.append(
                    {
                        "backend": backend,
                        "variant": name,
                        "ips_1x1": statistics.median(o["ips"] for o in base),
                        "ips_2x1": statistics.median(r["ips"] for r in rs),
                        "efficiency": statistics.median(effs),
                        "efficiency_min": min(effs),
                        "efficiency_max": max(effs),
                        "buckets": sync.get("bucket_mb"),
                        "comm_hook": sync.get("comm_hook"),
                    }
                )
                print(
                    f"  {backend} {name}: efficiency {rows[-1]['efficiency']:.2f} ({min(effs):.2f}-{max(effs):.2f})",
                    flush=True,
                )
        return rows

    def compression(self) -> List[Dict]:
        """What fp16 gradient compression costs in held-out accuracy: the same 2-process job on
        Fashion-MNIST (or, with --quick or without the dataset, held-out synthetic data) with
        and without it, over the repeats' seeds."""
        from unitrain.data.fashion_mnist import available

        if "torch" not in self.backends:  # the fp16 hook is torch's; Paddle's dynamic graph has none
            return []
        data = ["data=fashion_mnist"] if available() and not self.quick else ["data=learnable", "data.val_samples=256"]
        size = self.size if self.quick else Size("resnet18", 32, 300, 5)
        rows = []
        for compression in ("none", "fp16"):
            runs = [
                self.unitrain(
                    "torch",
                    *data,
                    f"dist.grad_compression={compression}",
                    f"trainer.seed={seed}",
                    "optim.lr=0.05",
                    world=2,
                    threads=1,
                    size=size,
                )
                for seed in range(self.repeats)
            ]
            tops = [r["val_top1"] for r in runs]
            rows.append(
                {
                    "backend": "torch",
                    "data": data[0].split("=")[1],
                    "steps": size.steps,
                    "grad_compression": compression,
                    "val_top1": statistics.median(tops),
                    "val_top1_min": min(tops),
                    "val_top1_max": max(tops),
                    "ips": statistics.median(r["ips"] for r in runs),
                }
            )
            print(
                f"  torch grad_compression={compression}: held-out top-1 {rows[-1]['val_top1']:.4f} "
                f"({min(tops):.4f}-{max(tops):.4f})",
                flush=True,
            )
        return rows

    def tuned(self) -> List[Dict]:
        """Same settings against backend.tuned=true (and each framework setting alone, named in
        backend.tuned_settings), interleaved pairs, at the overhead sizes; the speed-up is tuned
        samples/s over same-settings samples/s (compilation falls in the warm-up steps)."""
        rows = []
        for size in TUNED_SIZES[self.quick]:
            variants = [
                (b, v)
                for b, v in TUNED_VARIANTS[self.quick]
                if b in self.backends and v in (self.tuned_settings or [v])
            ]
            for backend, variant in variants:
                overrides = ["backend.tuned=true", f"backend.tuned_settings=[{variant}]"]
                pairs = []
                for i in range(self.pairs):
                    first, second = (
                        (overrides, ["backend.tuned=false"]) if i % 2 else (["backend.tuned=false"], overrides)
                    )
                    a, b = self.unitrain(backend, *first, size=size), self.unitrain(backend, *second, size=size)
                    pairs.append((a, b) if i % 2 == 0 else (b, a))
                speedup, low, high = median_ci([t["ips"] / s["ips"] for s, t in pairs])
                rows.append(
                    {
                        "model": size.model,
                        "image_size": size.image,
                        "backend": backend,
                        "variant": variant,
                        "pairs": len(pairs),
                        "same_ips": statistics.median(s["ips"] for s, _ in pairs),
                        "tuned_ips": statistics.median(t["ips"] for _, t in pairs),
                        "speedup": speedup,
                        "speedup_ci": [low, high],
                        "applied": pairs[0][1]["tuning"]["applied"],
                        "skipped": pairs[0][1]["tuning"]["skipped"],
                    }
                )
                print(
                    f"  {size.model} {size.image}px {backend} {variant}: tuned/same {speedup:.3f} [{low:.3f}, "
                    f"{high:.3f}] {rows[-1]['applied']}",
                    flush=True,
                )
        return rows

    def maxbatch(self) -> List[Dict]:
        """The largest batch that fits each backend's job (python -m unitrain.maxbatch), here
        against a memory limit standing for a device's memory (on a GPU: its own OOM error)."""
        model, image, limit, start, resolution, largest = MAXBATCH[self.quick]
        rows = []
        for backend in self.backends:
            out = self._dir(f"maxbatch_{backend}")
            cmd = [
                sys.executable,
                "-m",
                "unitrain.maxbatch",
                "--memory-limit",
                limit,
                "--start",
                str(start),
                "--resolution",
                str(resolution),
                "--max",
                str(largest),
                "--out",
                str(out / "search"),
                f"backend={backend}",
                f"model={model}",
                f"data.image_size={image}",
                "trainer.threads=2",
            ]
            self._run(cmd, f"maxbatch {backend}", cwd=out)
            result = json.loads((out / "search" / "maxbatch.json").read_text())
            fitted = [t for t in result["trials"] if t["fits"]]
            rows.append(
                {
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
            )
            print(f"  maxbatch {backend} {model}: {result['max_batch_size']} under {limit}", flush=True)
        return rows

    def amp(self) -> List[Dict]:
        rows = []
        for backend in self.backends:
            base = None
            for level in AMP_LEVELS[self.quick]:
                runs = [self.unitrain(backend, f"amp={level}", "amp.dtype=bfloat16") for _ in range(self.repeats)]
                ips = statistics.median(r["ips"] for r in runs)
                base = base or ips
                rows.append(
                    {
                        "backend": backend,
                        "amp": level,
                        "effective": runs[0]["effective"],
                        "ips": ips,
                        "ips_min": min(r["ips"] for r in runs),
                        "ips_max": max(r["ips"] for r in runs),
                        "vs_O0": ips / base,
                    }
                )
        return rows


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def machine() -> Dict[str, str]:
    info = cpu_info()
    versions = {}
    for module in ("torch", "paddle"):
        try:
            versions[module] = (
                subprocess.run(
                    [sys.executable, "-c", f"import {module}; print({module}.__version__)"],
                    capture_output=True,
                    text=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
        except IndexError:
            versions[module] = "?"
    extensions = " ".join(info["extensions"] or []) or "none of " + " ".join(FLAGS)
    # The vendor too: Paddle's MKL chooses its kernels by it (backends/paddle/blas.py).
    return {
        "cpu": f"{info['model'] or platform.processor()} ({info.get('vendor') or 'vendor unknown'})",
        "cores": str(os.cpu_count()),
        "extensions": extensions,
        "python": platform.python_version(),
        **versions,
    }


def markdown(results: Dict) -> str:
    def table(rows, cols):
        # Rows kept from an earlier run of the harness say when (and, if elsewhere, where) they ran.
        if any(r.get("measured_at") != results.get("started") for r in rows):
            cols = [*cols, ("measured", lambda r: provenance(results, r))]
        lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        lines += ["| " + " | ".join(fmt(r) for _, fmt in cols) + " |" for r in rows]
        return "\n".join(lines)

    m = results["machine"]
    if not results.get("config"):  # --combine: rows of several runs, each saying which
        out = [
            f"# unitrain benchmarks\n\n{m['cpu']}, {m['cores']} cores ({m.get('extensions', '?')}), Python "
            f"{m['python']}, torch {m['torch']}, "
            f"paddle {m['paddle']}; rows measured in separate runs of the harness, each named in its measured column.\n"
        ]
    else:
        out = [
            f"# unitrain benchmarks\n\n{m['cpu']}, {m['cores']} cores ({m.get('extensions', '?')}), Python "
            f"{m['python']}, torch {m['torch']}, paddle {m['paddle']}; "
            f"{results['config']['model']} at {results['config']['image_size']}x{results['config']['image_size']}, "
            f"batch {results['config']['batch_size']} "
            f"per process, {results['config']['steps']} steps ({results['config']['warmup']} left out as warm-up), "
            f"{results['config']['repeats']} repeat(s); "
            f"medians, with min-max over repeats.\n"
        ]
    out += (
        []
        if not results["overhead"]
        else [
            "## Overhead: unitrain / native step time (target <= 1.01)\n",
            "Natives share only the dataset with unitrain (their own ResNets). Ratio: median over interleaved pairs "
            "of the runs' "
            "median step times, [bootstrap 95% confidence interval]; CPU: the same for the process's CPU time per "
            "step.\n",
            table(
                results["overhead"],
                [
                    ("model", lambda r: f"{r['model']} {r['image_size']}x{r['image_size']}"),
                    ("backend", lambda r: r["backend"]),
                    ("processes x threads", lambda r: f"{r['processes']} x {r['threads']}"),
                    ("unitrain ms/step", lambda r: f"{r['unitrain_step_ms']:.1f}"),
                    ("native ms/step", lambda r: f"{r['native_step_ms']:.1f}"),
                    ("ratio", lambda r: f"{r['ratio']:.3f} [{r['ratio_ci'][0]:.3f}, {r['ratio_ci'][1]:.3f}]"),
                    (
                        "CPU ratio",
                        lambda r: f"{r['cpu_ratio']:.3f} [{r['cpu_ratio_ci'][0]:.3f}, {r['cpu_ratio_ci'][1]:.3f}]",
                    ),
                    ("pairs", lambda r: str(r["pairs"])),
                ],
            ),
        ]
    )
    if results.get("loop"):
        out += [
            "\n## The loop alone: Trainer.train_step / a hand-written step, alternating in one process\n",
            "Same model, optimizer and batches; median over steps of the per-step ratio, [bootstrap 95% CI].\n",
            table(
                results["loop"],
                [
                    ("model", lambda r: f"{r['model']} {r['image_size']}x{r['image_size']}"),
                    ("backend", lambda r: r["backend"]),
                    ("unitrain ms/step", lambda r: f"{r['unitrain_step_ms']:.1f}"),
                    ("by hand ms/step", lambda r: f"{r['by_hand_step_ms']:.1f}"),
                    ("ratio", lambda r: f"{r['ratio']:.3f} [{r['ratio_ci'][0]:.3f}, {r['ratio_ci'][1]:.3f}]"),
                    (
                        "CPU ratio",
                        lambda r: f"{r['cpu_ratio']:.3f} [{r['cpu_ratio_ci'][0]:.3f}, {r['cpu_ratio_ci'][1]:.3f}]",
                    ),
                    ("steps", lambda r: str(r["steps"])),
                ],
            ),
        ]
    out += (
        []
        if not results["overhead"]
        else [
            "\n## Start-up: seconds from command to first step\n",
            table(
                results["overhead"],
                [
                    ("model", lambda r: r["model"]),
                    ("backend", lambda r: r["backend"]),
                    ("processes", lambda r: str(r["processes"])),
                    ("unitrain s", lambda r: f"{r['unitrain_startup_s']:.2f}"),
                    ("native s", lambda r: f"{r['native_startup_s']:.2f}"),
                ],
            ),
        ]
    )
    out += (
        []
        if not results["data"]
        else [
            "\n## Data loading (target: reader ratio < 2% with workers)\n",
            table(
                results["data"],
                [
                    ("backend", lambda r: r["backend"]),
                    ("data", lambda r: r["data"]),
                    ("workers", lambda r: str(r["workers"])),
                    ("reader ratio", lambda r: f"{100 * r['reader_ratio']:.2f}%"),
                    ("samples/s", lambda r: f"{r['ips']:.1f}"),
                ],
            ),
        ]
    )
    out += (
        []
        if not results["scaling"]
        else [
            "\n## Data-parallel scaling on this machine (efficiency = ips(2x1) / (2 ips(1x1)))\n",
            "The frameworks' all-reduce levers, and the ceiling: two independent 1 x 1 jobs at once, with no "
            "all-reduce.\n",
            table(
                results["scaling"],
                [
                    ("backend", lambda r: r["backend"]),
                    ("variant", lambda r: r.get("variant", "default")),
                    ("1 proc x 1 thread", lambda r: f"{r['ips_1x1']:.1f}"),
                    ("2 procs x 1 thread", lambda r: f"{r['ips_2x1']:.1f}"),
                    (
                        "efficiency",
                        lambda r: f"{r['efficiency']:.2f} ({r['efficiency_min']:.2f}-{r['efficiency_max']:.2f})",
                    ),
                    (
                        "all-reduce buckets (MB)",
                        lambda r: ", ".join(f"{b:g}" for b in r["buckets"]) if r.get("buckets") else "-",
                    ),
                ],
            ),
        ]
    )
    if results.get("compression"):
        out += [
            "\n## What fp16 gradient compression costs (torch, 2 x 1, held-out top-1 over seeds)\n",
            table(
                results["compression"],
                [
                    ("data", lambda r: f"{r['data']}, {r['steps']} steps"),
                    ("grad_compression", lambda r: r["grad_compression"]),
                    (
                        "held-out top-1",
                        lambda r: f"{r['val_top1']:.4f} ({r['val_top1_min']:.4f}-{r['val_top1_max']:.4f})",
                    ),
                    ("samples/s", lambda r: f"{r['ips']:.1f}"),
                ],
            ),
        ]
    if results.get("maxbatch"):
        out += [
            "\n## Largest batch that fits (python -m unitrain.maxbatch)\n",
            table(
                results["maxbatch"],
                [
                    ("backend", lambda r: r["backend"]),
                    ("model", lambda r: f"{r['model']} {r['image_size']}x{r['image_size']}"),
                    ("memory limit", lambda r: f"{r['memory_limit_mb']:.0f} MiB"),
                    ("largest batch", lambda r: f"{r['max_batch_size']} (+-{r['resolution']})"),
                    ("peak at it", lambda r: f"{r['peak_mb_at_max']:.0f} MiB" if r["peak_mb_at_max"] else "-"),
                    ("trials", lambda r: str(r["trials"])),
                ],
            ),
        ]
    if results.get("tuned"):
        out += [
            "\n## Each framework at its best: backend.tuned=true against the same settings\n",
            "Speed-up: median over interleaved pairs of tuned / same-settings samples/s, [bootstrap 95% CI]; applied: "
            "what "
            "the framework reported it did.\n",
            table(
                results["tuned"],
                [
                    ("model", lambda r: f"{r['model']} {r['image_size']}x{r['image_size']}"),
                    ("backend", lambda r: r["backend"]),
                    ("tuned_settings", lambda r: r.get("variant", "default").replace(",", ", ")),
                    ("same settings samples/s", lambda r: f"{r['same_ips']:.1f}"),
                    ("tuned samples/s", lambda r: f"{r['tuned_ips']:.1f}"),
                    ("speed-up", lambda r: f"{r['speedup']:.3f} [{r['speedup_ci'][0]:.3f}, {r['speedup_ci'][1]:.3f}]"),
                    ("applied", lambda r: "; ".join(r["applied"]) or "nothing"),
                    ("pairs", lambda r: str(r["pairs"])),
                ],
            ),
        ]
    out += (
        []
        if not results["amp"]
        else [
            "\n## Mixed precision (bfloat16)\n",
            table(
                results["amp"],
                [
                    ("backend", lambda r: r["backend"]),
                    ("amp", lambda r: r["amp"]),
                    ("effective", lambda r: r["effective"]),
                    ("samples/s", lambda r: f"{r['ips']:.1f} ({r['ips_min']:.1f}-{r['ips_max']:.1f})"),
                    ("vs O0", lambda r: f"{r['vs_O0']:.2f}"),
                ],
            ),
        ]
    )
    return "\n".join(out) + "\n"


#: What makes two rows of a section the same measurement: a later run's row replaces an earlier
#: one with the same key, and leaves the others (a run of --backends torch keeps Paddle's rows).
ROW_KEYS = {
    "overhead": ("model", "image_size", "backend", "processes", "threads"),
    "loop": ("model", "image_size", "backend"),
    "data": ("backend", "data", "workers"),
    "scaling": ("backend", "variant"),
    "compression": ("backend", "data", "grad_compression"),
    "tuned": ("model", "image_size", "backend", "variant"),
    "maxbatch": ("backend", "model", "image_size"),
    "amp": ("backend", "amp"),
}


class Stopped(Exception):
    """SIGTERM or SIGHUP: ends the benchmark the way Ctrl-C does."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum, _frame):
    raise Stopped(signum)


def stop_on_termination() -> None:
    """SIGTERM and SIGHUP raise Stopped, so that ``with Bench(...)`` ends the commands it started
    (their own process groups do not hear the signal that ends this script)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_stopped)


def provenance(results: Dict, row: Dict) -> str:
    when = row.get("measured_at", "?")
    machine_ = results.get("runs", {}).get(when, {}).get("machine")
    if machine_ and (machine_.get("cpu"), machine_.get("extensions")) != (
        results["machine"].get("cpu"),
        results["machine"].get("extensions"),
    ):
        return f"{when} on {machine_['cpu']} ({machine_.get('extensions', '?')})"
    return when


def load_previous(
    path: Path,
    unstamped: str = "an earlier run (time not recorded)",
    advice: str = "move it away or pass another --out",
) -> Dict:
    """An earlier run's results in --out, each row stamped with the run that measured it (rows
    from before the stamps with ``unstamped``); {} when there is none.
    SystemExit(2) after one line when the file is not this harness's: nothing is run or written."""
    if not path.exists():
        return {}
    try:
        previous = json.loads(path.read_text())
        # Every run of the harness writes these sections, empty or not (the others came later).
        assert isinstance(previous, dict) and isinstance(previous["machine"], dict), "no machine"
        assert {"overhead", "data", "scaling", "amp"} <= previous.keys(), "no overhead, data, scaling and amp sections"
        for section in SECTIONS:
            for row in previous.get(section) or []:
                missing = [k for k in ROW_KEYS[section] if k not in row]
                assert not missing, f"its {section} rows lack {', '.join(missing)}: written by an older harness"
    except (ValueError, KeyError, AssertionError) as e:
        reason = str(e) if isinstance(e, AssertionError) else f"{type(e).__name__}: {e}"
        print(
            f"run.py: error: {path} is not results of this harness ({reason}); {advice}: nothing was run or written",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    # A file's time says when it was checked out, not measured: an older file's rows say so instead.
    when = previous.get("started") or unstamped
    runs = previous.setdefault("runs", {})
    runs.setdefault(when, {"machine": previous["machine"], "config": previous.get("config")})
    for section in SECTIONS:
        for row in previous.get(section) or []:
            row.setdefault("measured_at", when)
    return previous


def merge(previous: List[Dict], new: List[Dict], section: str) -> List[Dict]:
    """The earlier rows, each measured again in its place (so a table keeps its order), then the
    new rows that were not there."""
    key = lambda r: tuple(r.get(k) for k in ROW_KEYS[section])  # noqa: E731
    fresh = {key(r): r for r in new}
    merged = [fresh.pop(key(r), r) for r in previous]
    return merged + [r for r in new if key(r) in fresh]


def save(out: Path, results: Dict, with_json: bool = True) -> None:
    """results.json, results.md and results.png, each written beside and renamed into place: an
    interrupted benchmark leaves the last complete set, never half a file."""
    from plot import plot

    used = {r.get("measured_at") for section in SECTIONS for r in results.get(section) or []}
    results["runs"] = {
        when: run for when, run in results.get("runs", {}).items() if when in used or when == results["started"]
    }
    files = [("results.json", json.dumps(results, indent=2) + "\n")] if with_json else []
    for name, text in [*files, ("results.md", markdown(results))]:
        replace_text(out / name, text)
    plot(results, out / "results.png")


def combine(parser: argparse.ArgumentParser, folders: List[Path], out: Path) -> int:
    """Rows measured in separate runs (a noisy row alone, with more pairs) as one report."""
    if (out / "results.json").exists():
        parser.error(f"--combine writes a new {out / 'results.json'}, and one is there already: pass another --out")
    combined: Dict = {}
    for folder in folders:
        part = load_previous(folder / "results.json", unstamped=folder.name, advice="leave that folder out")
        if not part:
            parser.error(f"--combine takes folders holding a results.json of this harness; {folder} holds none")
        combined = combined or {"config": None, "runs": {}, **{s: [] for s in SECTIONS}}
        combined["machine"] = part[
            "machine"
        ]  # the header names the newest folder's machine; rows from another say theirs
        combined["runs"].update(part["runs"])
        for section in SECTIONS:
            combined[section] = merge(combined[section], part.get(section) or [], section)
    # No run of its own: every table says where each of its rows was measured.
    combined["started"] = "combined"
    out.mkdir(parents=True, exist_ok=True)
    save(out, combined)
    print(
        f"{sum(len(combined[s]) for s in SECTIONS)} rows from {len(folders)} folders: {out}/results.json, results.md "
        "and results.png"
    )
    return 0


def main(argv=None) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="the tiny model and few steps: checks the harness, measures little"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--pairs",
        type=int,
        default=None,
        help="interleaved unitrain/native pairs per overhead row (default 10; 2 with --quick)",
    )
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--backends", default=",".join(BACKENDS), help="which frameworks to measure (default: both)")
    parser.add_argument(
        "--tuned-settings",
        nargs="+",
        help="the tuned section measures only these variants, e.g. mkl_avx2 'compile,channels_last'",
    )
    parser.add_argument(
        "--models", help="the overhead section measures only these models, e.g. resnet50 (default: all)"
    )
    parser.add_argument(
        "--layouts", help="the overhead section measures only these processes x threads, e.g. 2x1 (default: 1x2,2x1)"
    )
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: write results.md and results.png again from --out's results.json",
    )
    parser.add_argument(
        "--combine",
        nargs="+",
        metavar="DIR",
        help="run nothing: one results.json, .md and .png in --out from the rows of "
        "these folders' results (a later folder's row replaces an earlier one's with the same key), each row saying "
        "where it came from",
    )
    args = parser.parse_args(argv)
    backends = args.backends.split(",")
    sections = args.sections.split(",")
    wrong = [b for b in backends if b not in BACKENDS] + [name for name in sections if name not in SECTIONS]
    known = sorted({v for variants in TUNED_VARIANTS.values() for _, v in variants})
    wrong += [v for v in args.tuned_settings or () if v not in known]
    layout_names = {f"{p}x{t}": (p, t) for p, t in LAYOUTS}
    models = sorted({s.model for s in OVERHEAD_SIZES[args.quick]})
    layouts = args.layouts.split(",") if args.layouts else list(layout_names)
    wrong += [v for v in layouts if v not in layout_names] + [
        m for m in (args.models.split(",") if args.models else ()) if m not in models
    ]
    if wrong:
        parser.error(
            f"{', '.join(wrong)} is not allowed: --backends takes {', '.join(BACKENDS)}; --sections takes "
            f"{', '.join(SECTIONS)}; "
            f"--tuned-settings takes {', '.join(known)}; --layouts takes {', '.join(layout_names)}; --models takes "
            f"{', '.join(models)}"
        )
    out = Path(args.out)
    previous = load_previous(out / "results.json")
    if args.combine:
        return combine(parser, [Path(folder) for folder in args.combine], out)
    if args.report_only:
        if not previous:
            parser.error(f"--report-only needs {out / 'results.json'}, which does not exist")
        previous.setdefault("started", max(previous["runs"]))
        save(out, previous, with_json=False)
        print(f"written from {out}/results.json: results.md and results.png")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="unitrain-bench-"))
    args.pairs = args.pairs or (2 if args.quick else 10)
    bench = Bench(
        args.quick,
        args.repeats,
        work,
        args.pairs,
        backends,
        args.tuned_settings,
        [layout_names[v] for v in layouts],
        args.models.split(",") if args.models else None,
    )
    config = {
        "model": bench.size.model,
        "image_size": bench.size.image,
        "batch_size": bench.batch,
        "steps": bench.size.steps,
        "warmup": bench.size.warmup,
        "repeats": args.repeats,
        "pairs": args.pairs,
        "quick": args.quick,
    }
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    here = machine()
    results = {
        "machine": here,
        "config": config,
        "started": started,
        "runs": {**previous.get("runs", {}), started: {"machine": here, "config": config}},
    }
    # What this run does not measure again stays, each row with the run that measured it.
    results.update({section: previous.get(section) or [] for section in SECTIONS})
    failed: Dict[str, str] = {}
    clock = time.time()
    stop_on_termination()
    section = None
    try:
        for section in sections:
            print(f"[{time.time() - clock:6.0f} s] {section} ...", flush=True)
            try:
                rows = getattr(bench, section)()
            except RuntimeError as e:
                # One failed command should not cost the hour's other sections; the full error is kept.
                failed[section] = str(e)
                (out / f"failed_{section}.log").write_text(str(e) + "\n")
                print(
                    f"run.py: section {section} failed: {str(e).splitlines()[0]} (its earlier rows are kept; "
                    f"the error is in {out / f'failed_{section}.log'})",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            for row in rows:
                row["measured_at"] = started
            results[section] = merge(results[section], rows, section)
            save(out, results)
            (out / f"failed_{section}.log").unlink(missing_ok=True)  # an earlier failure of it no longer holds
    except (KeyboardInterrupt, Stopped) as e:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        bench.stop()
        signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
        done = [s for s in sections[: sections.index(section) if section else 0] if s not in failed]
        print(
            f"run.py: stopped by {signal.Signals(signum).name} during {section}: its commands are ended; "
            + (
                f"the finished sections ({', '.join(done)}) are in {out / 'results.json'}"
                if done
                else "no section had finished: nothing was written"
            ),
            file=sys.stderr,
        )
        return 128 + signum
    finally:
        bench.stop()
        shutil.rmtree(work, ignore_errors=True)
    written = [s for s in sections if s not in failed]
    where = (
        f"written to {out}/results.json, results.md and results.png"
        if written
        else f"nothing written: {out} is as it was"
    )
    print(markdown(results) + f"\n{bench.runs} runs in {time.time() - clock:.0f} s; {where}")
    if failed:
        print(
            f"run.py: {len(failed)} section(s) failed: {', '.join(failed)}; see {out}/failed_<section>.log",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
