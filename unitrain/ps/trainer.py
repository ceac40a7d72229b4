"""One trainer of a parameter-server job: its loop over the backend's PsProgram (its steps, or the
passes its engine runs with dist.ps.feed=engine), held-out evaluations (AUC, log loss), checkpoint
steps, and what it records, ps/trainer<i>.json's content (:func:`train`). :mod:`unitrain.ps.job`
runs it in each trainer process and sums the trainers' results into the job's summary."""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from unitrain.data.criteo import CtrData, auc, log_loss
from unitrain.errors import ConfigError, UnitrainError
from unitrain.host.memory import peak_rss_mb
from unitrain.interface.ps import PsProgram, Role
from unitrain.ps import checkpoint
from unitrain.ps.checkpoint import Resumed
from unitrain.ps.data import JobData, job_data
from unitrain.train.metrics import MetricsLog

log = logging.getLogger("unitrain")

#: Steps left out of examples/s: the first pulls create the servers' table rows.
WARMUP_STEPS = 2


def evaluate(program: PsProgram, rows: CtrData, batch_size: int) -> Dict[str, float]:
    started = time.perf_counter()
    probabilities = np.concatenate(
        [program.predict(rows.rows(slice(i, i + batch_size))) for i in range(0, len(rows), batch_size)]
    )
    # What predicting the held-out rows' positive rate for every row scores: a model worse than
    # that has learned nothing (too high an lr, most often).
    base = float(np.mean(rows.label))
    return {
        "val_auc": auc(rows.label, probabilities),
        "val_logloss": log_loss(rows.label, probabilities),
        "base_rate_logloss": log_loss(rows.label, np.full(len(rows), base)),
        "eval_s": time.perf_counter() - started,
    }


@dataclass(kw_only=True)
class _Records:
    """What one trainer records: its steps and held-out evaluations in a MetricsLog (trainer 0's
    writes metrics.jsonl, as the training loop's does), and the time its evaluations took."""

    role: Role
    metrics: MetricsLog
    started: float = field(default_factory=time.perf_counter)
    eval_time: float = 0.0

    @property
    def steps(self) -> List[Dict[str, float]]:
        return self.metrics.records

    @property
    def evals(self) -> List[Dict[str, float]]:
        return self.metrics.evals

    def step(self, record: Dict[str, float]) -> None:
        self.metrics.append(record)

    def evaluate(self, program: PsProgram, rows: CtrData, batch_size: int, step: int) -> None:
        result = evaluate(program, rows, batch_size)
        self.eval_time += result["eval_s"]
        record = {"step": step, **result, "elapsed_s": time.perf_counter() - self.started}
        log.info(
            "%s held-out at step %d: AUC %.4f  log loss %.4f",
            self.role.name,
            step,
            record["val_auc"],
            record["val_logloss"],
        )
        if record["val_logloss"] >= record["base_rate_logloss"]:
            log.warning(
                "%s held-out log loss %.4f at step %d is no better than predicting the base rate (%.4f): the model "
                "has not learned; a lower optim.lr trains it",
                self.role.name,
                record["val_logloss"],
                step,
                record["base_rate_logloss"],
            )
        self.metrics.append_eval(record)


def _steps_per_epoch(cfg: Any, smallest: int) -> int:
    """Every trainer takes as many steps as the smallest share allows: sync mode meets at a
    barrier each step, and a trainer with one more batch would wait there for ever."""
    batch_size = cfg.trainer.batch_size
    steps = min(smallest // batch_size, cfg.trainer.steps or smallest)
    if smallest == 0:
        trainers = cfg.dist.ps.trainers
        key, value = (
            ("data.num_samples", cfg.data.num_samples) if cfg.data.num_samples else ("data.path", cfg.data.path)
        )
        raise ConfigError(
            key, value, f"rows enough for each of the dist.ps.trainers={trainers} trainers (one has none)"
        )
    if steps == 0:
        raise ConfigError(
            "trainer.batch_size", batch_size, f"at most {smallest}, the rows of the smallest trainer's share"
        )
    return steps


@dataclass(kw_only=True)
class _Job:
    """One trainer's run: its program, rows, step counts and records."""

    cfg: Any
    program: PsProgram
    role: Role
    run_dir: Path
    data: JobData
    steps_per_epoch: int
    out: _Records

    @property
    def total(self) -> int:
        return self.steps_per_epoch * self.cfg.trainer.epochs


def train(
    cfg: Any, program: PsProgram, role: Role, run_dir: Path, describe: Dict[str, Any], resumed: Optional[Resumed]
) -> Dict[str, Any]:
    """The loop of one trainer; trainer 0 also evaluates, writes metrics.jsonl and checkpoints.
    What it returns is the trainer's ps/trainer<i>.json."""
    first = role.index == 0
    data = job_data(cfg, role.index, role.trainers, held_out=first)
    steps_per_epoch = _steps_per_epoch(cfg, data.smallest)
    if resumed:
        checkpoint.check_epoch(resumed, steps_per_epoch, steps_per_epoch * cfg.trainer.epochs)
    out = _Records(role=role, metrics=MetricsLog(run_dir / "metrics.jsonl" if first else None))
    job = _Job(
        cfg=cfg, program=program, role=role, run_dir=run_dir, data=data, steps_per_epoch=steps_per_epoch, out=out
    )
    start = resumed.step if resumed else 0
    log.info(
        "%s: %d of %d rows, %d steps of %d%s",
        role.name,
        data.share.rows,
        data.rows,
        job.total,
        cfg.trainer.batch_size,
        f", resumed after step {start} from {resumed.path}" if resumed else "",
    )
    try:
        step = _passes(job) if cfg.dist.ps.feed == "engine" else _epochs(job, start)
        train_time = time.perf_counter() - out.started - out.eval_time
        program.end_training()
        if data.held_out is not None:
            out.evaluate(program, data.held_out, cfg.trainer.eval_batch_size, step)
    finally:
        out.metrics.close()
    result = _trainer_result(out, program, role, describe, data.share.rows, cfg.trainer.batch_size, train_time)
    result["resumed_from"] = {"path": str(resumed.path), "step": start} if resumed else None
    return result


def _epochs(job: _Job, start: int) -> int:
    """Steps ``start+1 .. total``, the batches of each epoch from where ``start`` left it."""
    cfg, out, step = job.cfg, job.out, start
    for epoch in range(start // job.steps_per_epoch, cfg.trainer.epochs):
        skip = step - epoch * job.steps_per_epoch
        batches = job.program.batches(job.data.share, cfg.trainer.batch_size, cfg.data.num_workers, skip)
        for _, batch in zip(range(job.steps_per_epoch - skip), batches):
            step += 1
            out.step(_train_step(job.program, batch, step, epoch, cfg, job.role))
            _after_step(job, step)
        del batches  # its loader workers end with it
    return step


def _passes(job: _Job) -> int:
    """dist.ps.feed=engine: the engine runs each epoch as one pass over the trainer's files; a
    pass is recorded as one step of all its rows."""
    cfg, out, role = job.cfg, job.out, job.role
    batch_size, threads = cfg.trainer.batch_size, cfg.dist.ps.threads

    def progress(loss: float) -> None:
        log.info("%s: loss %.4f at %.0f s", role.name, loss, time.perf_counter() - out.started)

    steps = 0
    for epoch in range(cfg.trainer.epochs):
        done = job.program.train_pass(job.data.share, batch_size, threads, progress)
        batches = math.ceil(done.rows / batch_size)
        steps += batches
        ips = done.rows / done.seconds
        # None: the pass ended before the engine's first reading of its loss.
        loss = done.loss if math.isfinite(done.loss) else None
        record = {"step": steps, "epoch": epoch, "loss": loss, "batch_cost": done.seconds, "ips": ips}
        out.step({**record, "batches": batches, "rows": done.rows})
        log.info("%s pass %d: %d rows in %.1f s, %.0f examples/s", role.name, epoch + 1, done.rows, done.seconds, ips)
    return steps


def _after_step(job: _Job, step: int) -> None:
    cfg, out = job.cfg, job.out
    if step % cfg.trainer.log_every == 0 or step == job.total:
        record = out.steps[-1]
        log.info(
            "%s step %d/%d  loss %.4f  %.0f examples/s", job.role.name, step, job.total, record["loss"], record["ips"]
        )
    every = cfg.trainer.eval_every
    if job.data.held_out is not None and every and step % every == 0 and step < job.total:
        out.evaluate(job.program, job.data.held_out, cfg.trainer.eval_batch_size, step)
    save_every = cfg.trainer.checkpoint_every
    if save_every and (step % save_every == 0 or step == job.total):
        tick = time.perf_counter()
        job.program.barrier()
        if job.role.index == 0:
            path = checkpoint.save(job.run_dir, cfg, job.program, step, job.steps_per_epoch, job.data.standardize)
            log.info("checkpoint of step %d: %s", step, path)
        job.program.barrier()
        out.eval_time += time.perf_counter() - tick  # not training time either


def _train_step(program: PsProgram, batch: CtrData, step: int, epoch: int, cfg: Any, role: Role) -> Dict[str, float]:
    tick = time.perf_counter()
    loss = program.train_batch(batch)
    cost = time.perf_counter() - tick
    if not math.isfinite(loss):
        raise UnitrainError(f"the loss is {loss} at step {step} on {role.name}; lower optim.lr ({cfg.optim.lr:g})")
    return {"step": step, "epoch": epoch, "loss": loss, "batch_cost": cost, "ips": cfg.trainer.batch_size / cost}


def _trainer_result(
    out: _Records,
    program: PsProgram,
    role: Role,
    describe: Dict[str, Any],
    rows: int,
    batch_size: int,
    train_time: float,
) -> Dict[str, Any]:
    """ps/trainer<i>.json: what the main process sums into the job's summary."""
    # A pass the engine ran is one record of many batches (dist.ps.feed=engine).
    records = out.steps
    steps = sum(r.get("batches", 1) for r in records)
    examples = sum(r.get("rows", batch_size) for r in records)
    timed = [r["ips"] for r in records[WARMUP_STEPS:]] or [r["ips"] for r in records]
    result = {
        "role": role.name,
        **describe,
        "rows": rows,
        "steps": steps,
        "examples_per_s": statistics.median(timed),
        # All rows over all the time the loop took, stalls included.
        "examples_per_s_overall": examples / train_time if train_time > 0 else None,
        "train_time_s": train_time,
        "final_loss": mean([r["loss"] for r in records[-10:]]),
        # A pass run by the engine has no first step of its own.
        "first_loss": None if "batches" in records[0] else records[0]["loss"],
        "eval": out.evals[-1] if out.evals else None,
        "observed": program.observed(),
        "peak_rss_mb": peak_rss_mb(),
    }
    return result


def mean(values: List[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None
