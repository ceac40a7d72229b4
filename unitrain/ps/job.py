"""Parameter-server training (``dist.mode=ps``): wide&deep on Criteo-format rows.

Servers hold the parameters (above all the sparse embedding tables); trainers read disjoint
shards, push gradients and pull parameters. The frameworks' own engines do the work (Paddle
Fleet's parameter server, PyTorch's torch.distributed.rpc), each behind a backend module
``backends/<name>/ps.py`` that builds a :class:`PsProgram` for one process. This module is the
framework-neutral rest: the roles, the data each trainer reads, the training loop, the metrics
(AUC, log loss, examples/s) computed identically for both, and the summary.

The process layout is the same on both frameworks: ``dist.ps.servers`` servers numbered 0..S-1
and ``dist.ps.trainers`` trainers 0..T-1, numbered node after node over several nodes (each node
runs its servers, then its trainers: :class:`~unitrain.interface.ps.PsLayout`). ``servers=0`` is
the baseline: one trainer, no servers, the same model trained in one process.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

import numpy as np

from unitrain.data.criteo import CtrData, auc, log_loss
from unitrain.errors import ConfigError, UnitrainError
from unitrain.host import machine
from unitrain.host.atomic import replace_text
from unitrain.host.memory import peak_rss_mb
from unitrain.interface.backend import get_backend
from unitrain.interface.launch import launch_module
from unitrain.interface.ps import PsLayout, PsProgram, Role, ps_module
from unitrain.ps import checkpoint
from unitrain.ps.checkpoint import Resumed
from unitrain.ps.data import JobData, job_data
from unitrain.train import summary as summaries
from unitrain.train.metrics import MetricsLog

log = logging.getLogger("unitrain")

#: Steps left out of examples/s: the first pulls create the servers' table rows.
WARMUP_STEPS = 2
RESULTS = "ps"  # per-trainer results, <run_dir>/ps/trainer<i>.json


def role_from_env(backend: str, env: Mapping[str, str], layout: PsLayout, node: int) -> Role:
    """This process's role, read from what the framework's launcher set on node ``node``."""
    if layout.total_servers == 0:
        return Role("trainer", 0, 0, 1, local=0)
    role = launch_module(backend).ps_role(env, layout)
    here = layout.server_indices(node) if role.kind == "server" else layout.trainer_indices(node)
    return replace(role, local=role.index - here.start)


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
    """The loop of one trainer; trainer 0 also evaluates, writes metrics.jsonl and checkpoints."""
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
    _write_result(run_dir, role, result)
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
        "final_loss": _mean([r["loss"] for r in records[-10:]]),
        # A pass run by the engine has no first step of its own.
        "first_loss": None if "batches" in records[0] else records[0]["loss"],
        "eval": out.evals[-1] if out.evals else None,
        "observed": program.observed(),
        "peak_rss_mb": peak_rss_mb(),
    }
    return result


def _beats_base_rate(evaluation: Optional[Dict[str, float]]) -> Optional[bool]:
    if not evaluation or "base_rate_logloss" not in evaluation:
        return None
    return evaluation["val_logloss"] < evaluation["base_rate_logloss"]


def _mean(values: List[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _write_result(run_dir: Path, role: Role, result: Dict[str, Any]) -> None:
    folder = run_dir / RESULTS
    folder.mkdir(exist_ok=True)
    replace_text(folder / f"{role.kind}{role.index}.json", json.dumps(result, indent=2) + "\n")


def run_process(cfg, run_dir: Path, role: Role, on_connected: Callable[[], None] = lambda: None) -> None:
    """What each process of the job runs (entry/worker.py calls it): serve, or train.
    ``on_connected`` is called once the engine has reached the job's other processes."""
    backend = get_backend(cfg.backend.name)
    backend.set_threads(cfg.trainer.threads)
    backend.seed(cfg.trainer.seed)
    resumed = checkpoint.find(cfg, run_dir)
    program = ps_module(cfg.backend.name).build(cfg, role, resumed.path if resumed else None)
    on_connected()
    try:
        if role.kind == "server":
            program.run_server()
            _write_result(run_dir, role, {"role": role.name, "peak_rss_mb": peak_rss_mb()})
        else:
            train(cfg, program, role, run_dir, backend.describe(), resumed)
    finally:
        program.close()


def _node_processes(layout: PsLayout, node: int) -> Dict[str, Any]:
    return {
        "rank": node,
        "servers": list(layout.server_indices(node)),
        "trainers": list(layout.trainer_indices(node)),
    }


def _server_memory(run_dir: Path, servers: Iterable[int]) -> List[Optional[float]]:
    """Each server's peak RSS, as it wrote it when it stopped serving (None: it did not)."""
    out = []
    for i in servers:
        path = run_dir / RESULTS / f"server{i}.json"
        out.append(json.loads(path.read_text())["peak_rss_mb"] if path.exists() else None)
    return out


def _trainer_results(cfg, run_dir: Path) -> List[Dict[str, Any]]:
    """What this node's trainers wrote when they ended."""
    here = PsLayout.of(cfg.dist.ps, cfg.dist.nnodes).trainer_indices(cfg.dist.node_rank)
    results = []
    for local, i in enumerate(here):
        path = run_dir / RESULTS / f"trainer{i}.json"
        if not path.exists():
            raise UnitrainError(
                f"trainer {i} ended without writing its results ({path}); see workerlog.{local} in {run_dir}"
            )
        results.append(json.loads(path.read_text()))
    return results


def _job_settings(cfg) -> Dict[str, Any]:
    """What the summary's table shows of how the job was set."""
    ps = cfg.dist.ps
    return {
        "model": cfg.model.name,
        "data": cfg.data.name,
        "mode": "local" if ps.servers == 0 else ps.sync,
        "servers": ps.servers,
        "trainers": ps.trainers,
        "geo_k_steps": ps.geo_k_steps if ps.sync == "geo" and ps.servers else None,
        "optimizer": cfg.optim.name,
        "lr": cfg.optim.lr,
        "batch_size": cfg.trainer.batch_size,
        "seed": cfg.trainer.seed,
    }


def summarize(cfg, run_dir: Path, wall: float) -> Optional[Dict[str, Any]]:
    """summary.json of the job, from its trainers' results (the main process writes it). Over
    several nodes, each node has its own processes' results: the node of trainer 0, which
    evaluates, writes the summary of its processes; the others write none (None)."""
    ps = cfg.dist.ps
    layout = PsLayout.of(ps, cfg.dist.nnodes)
    node = cfg.dist.node_rank
    if 0 not in layout.trainer_indices(node):
        _trainer_results(cfg, run_dir)  # that they ended well
        return None
    results = _trainer_results(cfg, run_dir)
    first = results[0]
    summary = {
        "kind": "ps",
        **{key: first[key] for key in ("backend", "framework", "version", "threads")},
        **_job_settings(cfg),
        "rows": sum(r["rows"] for r in results),
        "steps": first["steps"],
        "examples_per_s_per_trainer": [r["examples_per_s"] for r in results],
        "examples_per_s": sum(r["examples_per_s"] for r in results),
        "examples_per_s_overall": sum(r["examples_per_s_overall"] or 0 for r in results),
        "first_loss": first["first_loss"],
        "final_loss": _mean([r["final_loss"] for r in results]),
        "eval": first["eval"],
        # False: the held-out log loss is no better than the base rate's (the model learned nothing).
        "beats_base_rate": _beats_base_rate(first["eval"]),
        "resumed_from": first.get("resumed_from"),
        "observed": first["observed"],
        # What the servers' tables hold at the end (rows created, bytes of rows and their
        # optimizer state), as the engine reports it.
        "tables": first["observed"].get("tables"),
        "memory": {
            "trainer_peak_rss_mb": [r["peak_rss_mb"] for r in results],
            "server_peak_rss_mb": _server_memory(run_dir, layout.server_indices(node)),
        },
        # Several nodes: the processes this summary covers (the others' are on their nodes).
        "node": _node_processes(layout, node) if cfg.dist.nnodes > 1 else None,
        "wall_time_s": wall,
        "cpu": machine.cpu(),
    }
    summaries.write(run_dir, summary)
    return summary
