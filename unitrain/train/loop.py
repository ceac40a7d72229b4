"""What one pass of the training loop keeps between steps (:class:`Loop`): the step timer, the
framework's trace, metrics.jsonl and its sinks, the progress bar, the non-finite watch, the
clock; how a pass starts, and how the pending steps' values are reduced over ranks and logged."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

from unitrain.interface.backend import Backend
from unitrain.interface.distributed import DistributedContext
from unitrain.interface.profiler import Tracer, profiler_module
from unitrain.train.job import Job
from unitrain.train.loggers import make_sinks
from unitrain.train.metrics import METRICS, MetricsLog, NonFiniteWatch, own_records
from unitrain.train.progress import StepProgress
from unitrain.train.step_timer import Profiler

log = logging.getLogger("unitrain")

Record = Dict[str, Any]


@dataclass(kw_only=True)
class Loop:
    """What one pass of the loop keeps between steps."""

    profiler: Profiler
    tracer: Tracer
    metrics: MetricsLog
    progress: StepProgress
    watch: NonFiniteWatch
    step: int
    # A resumed run's clock continues from its checkpoint's, so that time to a target counts the
    # training and evaluation of every step it keeps (not the work lost after the checkpoint,
    # nor the time between the two runs) and the curves against time do not jump back.
    clock_offset: float
    started: float = field(default_factory=time.perf_counter)
    started_at: float = field(default_factory=time.time)  # wall clock, for start-up measurements
    evaluations: List[Record] = field(default_factory=list)
    # Steps whose loss is not yet reduced over ranks: (record, this rank's loss/top1/top5, stepped).
    pending: List[Tuple[Record, np.ndarray, bool]] = field(default_factory=list)

    def elapsed(self) -> float:
        return self.clock_offset + time.perf_counter() - self.started


@dataclass(frozen=True)
class Due:
    """What the step just taken calls for."""

    log: bool
    evaluate: bool
    checkpoint: bool


def trace_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"trace.rank{rank}.json"


def start_loop(cfg: Any, backend: Backend, job: Job, run_dir: Path, threads: int) -> Loop:
    """A pass's timer, trace, metrics and progress; its first line in the log."""
    dist, plan = job.dist, job.plan
    # The history's step times join this run's throughput only if this framework ran them.
    profiler = Profiler(cfg.profiler.warmup_steps, enabled=cfg.profiler.mode != "off", history=own_records(job.history))
    trace = cfg.profiler.mode == "trace"
    tracer = (
        profiler_module(backend.name).make_tracer(cfg.profiler, trace_file(run_dir, dist.rank)) if trace else Tracer()
    )
    main = dist.is_main_process
    sinks = make_sinks(cfg.trainer.loggers, run_dir) if main else ()
    metrics = MetricsLog(run_dir / METRICS if main else None, sinks, history=job.history)
    log.info(
        "%s %s on %s (rank %d of %d), %d thread(s), %s, %d steps of %d samples (%d per device x %d micro-steps), lr %g",
        backend.package,
        backend.version(),
        dist.device,
        dist.rank,
        dist.world_size,
        threads,
        job.precision.requested,
        job.total_steps,
        plan.global_batch,
        plan.micro_batch,
        plan.accumulate_steps,
        plan.lr,
    )
    _warn_of_warmup(cfg, job)
    progress = StepProgress(
        job.total_steps, f"{backend.name} {cfg.model.name}", main and cfg.trainer.progress, cfg.trainer.log_every
    )
    return Loop(
        profiler=profiler,
        tracer=tracer,
        metrics=metrics,
        progress=progress,
        watch=NonFiniteWatch(cfg.trainer.on_nonfinite, cfg.optim.lr),
        step=job.start_step,
        clock_offset=max((r.get("elapsed_s", 0.0) for r in job.history), default=0.0),
        evaluations=list(metrics.evals),
    )


def _warn_of_warmup(cfg: Any, job: Job) -> None:
    warmup = cfg.profiler.warmup_steps
    if cfg.profiler.mode != "off" and warmup and warmup >= job.total_steps and job.dist.is_main_process:
        log.warning(
            "profiler.warmup_steps=%d leaves none of this run's %d steps after the warm-up: its timing summary "
            "includes the warm-up steps",
            warmup,
            job.total_steps,
        )


def log_pending(dist: DistributedContext, loop: Loop) -> None:
    """Reduce the pending steps' loss/top1/top5 over ranks in one collective, then log them;
    the non-finite watch stops the run here.

    Every rank gets the same reduced values, so every rank stops at the same step when the
    loss is not finite: none is left waiting in a collective for the others."""
    values = np.atleast_2d(dist.all_reduce(np.stack([local for _, local, _ in loop.pending]), "mean"))
    try:
        for (record, _, stepped), (loss, top1, top5) in zip(loop.pending, values):
            record.update(loss=float(loss), top1=float(top1), top5=float(top5))
            loop.metrics.append(record)
            loop.progress.update(record["step"], record)
            loop.watch.check(record["step"], float(loss), stepped)
    finally:
        loop.pending.clear()
