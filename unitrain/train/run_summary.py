"""A finished run's summary.json as the Trainer writes it: what ran (framework, devices, model,
data, batch, precision), its throughput and final metrics, its task's own fields, then what
train/summary.py measures at the end (memory, ranks in sync, trace, held-out results)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Dict, Optional

from unitrain.host import machine
from unitrain.interface.backend import Backend
from unitrain.interface.profiler import Tracer
from unitrain.tasks import Task, TaskData
from unitrain.train import summary as summaries
from unitrain.train.job import Job
from unitrain.train.loop import Loop
from unitrain.train.metrics import steps_by_framework


def run_summary(
    cfg: Any,
    backend: Backend,
    job: Job,
    loop: Loop,
    task: Task,
    data: TaskData,
    malloc: Optional[Dict[str, Any]],
    wall: float,
) -> Dict[str, Any]:
    """What ran and how fast, as the loop saw it; ``wall``: the whole run's seconds."""
    plan, records = job.plan, loop.metrics.records
    perf = loop.profiler.summary()
    return {
        "unitrain_version": machine.unitrain_version(),
        "host": socket.gethostname(),  # runs on one host at the same time compete (report.fairness)
        **backend.describe(),
        **job.dist.describe(),
        "seed": cfg.trainer.seed,
        "model": cfg.model.name,
        "data": cfg.data.name,
        "task": task.name,
        "image_size": cfg.data.image_size,
        "num_classes": job.num_classes,
        "num_samples": len(job.dataset),
        "batch_size": plan.micro_batch,
        "accumulate_steps": plan.accumulate_steps,
        "global_batch_size": plan.global_batch,
        "lr": plan.lr,
        "lr_scaling": cfg.optim.lr_scaling,
        "steps": len(records),
        "epochs": cfg.trainer.epochs,
        "precision": job.precision.describe(),
        "malloc": malloc,
        "first_loss": records[0]["loss"] if records else None,
        "final": loop.metrics.final(),
        "throughput": {
            "samples_per_s": perf["ips"]["median"] if perf else None,
            "samples_per_s_min": perf["ips"]["min"] if perf else None,
            "samples_per_s_max": perf["ips"]["max"] if perf else None,
            "step_time_s": perf["batch_cost"]["median"] if perf else None,
        },
        "profiler": perf,
        "wall_time_s": wall,
        **task.summary(data, perf["ips"]["median"] if perf else None),
    }


def end_of_run(
    cfg: Any, backend: Backend, job: Job, loop: Loop, run_dir: Path, trace_file: Optional[Path], tracer: Tracer
) -> Dict[str, Any]:
    """What is measured once the loop ended: parameters, ranks in sync, the trace's top
    operators, memory, the CPU, skipped files, held-out results, tuning, who ran which steps."""
    dist, profile = job.dist, cfg.profiler
    window = range(profile.start, profile.start + profile.steps)
    trace = summaries.trace_summary(tracer, trace_file, window, run_dir, dist.rank) if profile.mode == "trace" else None
    return dict(
        num_parameters=backend.num_parameters(job.raw_model),
        ranks_in_sync=summaries.ranks_in_sync(
            backend, dist, job.raw_model, run_dir if cfg.trainer.save_final_weights else None
        ),
        trace=trace,
        loop_started_at=loop.started_at,
        memory=summaries.peak_memory(backend, dist),
        cpu=machine.cpu(),
        data_skipped_files=summaries.skipped(job.dataset, job.evaluator),
        eval=summaries.held_out(loop.evaluations),
        tuning=job.speed.describe(),
        # Which framework ran which steps: a run resumed from the other framework's
        # checkpoint holds its steps, clock and evaluations up to the checkpoint.
        steps_by_framework=steps_by_framework(loop.metrics.records, backend.name),
    )
