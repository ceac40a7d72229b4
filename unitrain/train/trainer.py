"""The one training loop: framework-neutral, it drives any Backend through the interfaces."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import resource
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
from omegaconf import OmegaConf

from unitrain import __version__
from unitrain.host import machine
from unitrain.host import malloc
from unitrain.data.augment import AugmentedDataset, EpochKeyedBatches
from unitrain.interface.backend import Backend, get_backend
from unitrain.train.checkpoint import (
    checkpoint_run_dir, clean_partial_checkpoints, find_checkpoint, load_checkpoint, prune_checkpoints, save_checkpoint,
)  # fmt: skip
from unitrain.config.schema import UnitrainConfig
from unitrain.data.datasets import build_dataset, build_heldout_dataset, guard, skipped_files
from unitrain.train.evaluation import Evaluator
from unitrain.errors import ConfigError, NothingLeftToRun
from unitrain.train.loggers import make_sinks
from unitrain.train.metrics import MetricsLog, NonFiniteWatch, label_history, metrics_history, own_records, steps_by_framework, topk_accuracy
from unitrain.interface.profiler import Tracer
from unitrain.train.step_timer import Profiler
from unitrain.train.progress import StepProgress
from unitrain.train.tracing import load_events, operators_markdown, top_operators
from unitrain.interface.speed_settings import SpeedSettings, make_speed_settings
from unitrain.data.sampler import DistributedBatchSampler
from unitrain.config.schedule import BatchPlan, lr_at
from unitrain.host.threads import export_threads, resolve_threads

log = logging.getLogger("unitrain")


def train(cfg: UnitrainConfig, run_dir: str | Path) -> Dict[str, Any]:
    """One process's share of a job: threads, backend, loop. Single-process runs and workers alike."""
    threads = resolve_threads(cfg.trainer.threads, cfg.dist.nproc_per_node)
    export_threads(threads)  # before get_backend imports the framework
    return Trainer(cfg, get_backend(cfg.backend.name), run_dir, threads).fit()


@dataclass
class Job:
    """The pieces of a run, built once by :meth:`Trainer.setup` and used by the loop, and by
    anything else that trains or evaluates the same model rather than building its own."""

    dist: Any
    precision: Any
    plan: BatchPlan
    dataset: Any
    sampler: Any  # a DistributedBatchSampler, or its epoch-keyed view with augmentation
    loader: Any
    model: Any  # wrapped for data parallel: train with this one
    optimizer: Any
    raw_model: Any  # unwrapped: evaluate, checkpoint and inspect this one
    raw_optimizer: Any
    steps_per_epoch: int
    total_steps: int
    num_classes: int
    start_step: int = 0
    history: List[Dict[str, Any]] = field(default_factory=list)  # another framework's records say so (label_history)
    evaluator: Optional[Evaluator] = None
    speed: SpeedSettings = field(default_factory=SpeedSettings)


class Trainer:
    """Runs ``cfg`` on ``backend`` and writes metrics.jsonl and summary.json into ``run_dir``."""

    def __init__(self, cfg: UnitrainConfig, backend: Backend, run_dir: str | Path, threads: int, prepare_model: Optional[Callable[[Any], Any]] = None):
        self.cfg, self.backend, self.threads = cfg, backend, threads
        self.run_dir = Path(run_dir)
        # Applied to the freshly built model before the optimizer sees its parameters: how
        # quantization-aware training gives the loop a model with fake quantization inserted.
        self.prepare_model = prepare_model
        self.malloc: Optional[Dict[str, Any]] = None  # what fit() set (unitrain/malloc.py)

    def fit(self) -> Dict[str, Any]:
        self.malloc = malloc.apply(self.cfg.trainer.malloc)
        self.backend.set_threads(self.threads)
        self.backend.seed(self.cfg.trainer.seed)
        with self.backend.distributed(self.cfg.dist, self.cfg.backend.device) as dist:
            summary = self._fit(dist)
            # The model, optimizer and DDP wrapper were local to _fit; collect their reference
            # cycles now, while the process group exists. Left to interpreter shutdown, gloo
            # work they hold aborts the process (pytorch/pytorch#179291).
            gc.collect()
        return summary

    def setup(self, dist) -> "Job":
        """Build everything a run needs, once: data, sampler, model (restored from
        ``trainer.resume``), optimizer, precision, the distributed wrappers, loaders, evaluator."""
        cfg, backend = self.cfg, self.backend
        precision = backend.precision(cfg.amp)
        plan = BatchPlan.from_config(cfg, dist.world_size)
        accumulate = plan.accumulate_steps
        steps = cfg.trainer.steps
        dataset = build_dataset(cfg.data, default_size=(steps or 1) * plan.global_batch, seed=cfg.trainer.seed)
        sampler = DistributedBatchSampler(
            len(dataset), plan.micro_batch, dist.world_size, dist.rank, cfg.data.shuffle, cfg.trainer.seed,
            cfg.data.drop_last, cfg.data.remainder, cfg.data.order,
        )  # fmt: skip
        batches_per_epoch = len(sampler) // accumulate
        if batches_per_epoch == 0:
            raise ConfigError(
                "trainer.batch_size", cfg.trainer.batch_size,
                f"at most {sampler.per_replica // accumulate} per device and micro-step (each of {dist.world_size} "
                f"process(es) gets {sampler.per_replica} of {len(dataset)} samples) with data.drop_last=true; "
                "use a smaller batch or data.drop_last=false",
            )  # fmt: skip
        steps_per_epoch = min(steps or batches_per_epoch, batches_per_epoch)
        if steps and steps > batches_per_epoch:
            log.warning("trainer.steps=%d but the data holds %d batches per epoch: running %d", steps, batches_per_epoch, batches_per_epoch)
        total_steps = steps_per_epoch * cfg.trainer.epochs
        num_classes = getattr(dataset, "num_classes", cfg.data.num_classes)

        model = backend.build_model(cfg.model.name, num_classes, dist.device, cfg.model.zero_init_residual, cfg.model.init, cfg.trainer.seed)
        if self.prepare_model is not None:
            model = self.prepare_model(model)
        speed = make_speed_settings(backend.name, cfg.backend.tuned, dist.device, cfg.backend.tuned_settings)
        model = speed.prepare_model(model)
        optimizer = backend.build_optimizer(model, cfg.optim)
        model, optimizer = precision.decorate(model, optimizer)
        start_step, history = self._resume(model, optimizer, precision)
        if start_step >= total_steps:
            # Before metrics.jsonl is opened: the finished run's results stay as they are.
            raise NothingLeftToRun(f"the checkpoint is at step {start_step} and this run has {total_steps} steps: nothing left to run; earlier results are unchanged")
        if dist.is_main_process:
            clean_partial_checkpoints(self.run_dir)
        held_out = build_heldout_dataset(cfg.data, seed=cfg.trainer.seed)
        evaluator = Evaluator(backend, held_out, dist, cfg.trainer.eval_batch_size, cfg.data.num_workers) if held_out is not None else None
        wrapped_model, wrapped_optimizer = speed.wrap_model(dist.wrap_model(model)), dist.wrap_optimizer(optimizer)
        if cfg.data.augment != "none":
            dataset, sampler = AugmentedDataset(dataset, cfg.trainer.seed, cfg.data.augment), EpochKeyedBatches(sampler, len(dataset))
        loader = guard(backend.make_loader(dataset, sampler, cfg.data.num_workers, dist.device), dataset, backend)
        return Job(
            dist, precision, plan, dataset, sampler, loader, wrapped_model, wrapped_optimizer, model, optimizer,
            steps_per_epoch, total_steps, num_classes, start_step, history, evaluator, speed,
        )  # fmt: skip

    def train_mode(self, job: "Job") -> None:
        job.model.train()
        if self.cfg.model.freeze_bn:
            self.backend.freeze_batchnorm(job.model)

    def train_step(self, job: "Job", step: int, batches: Iterator) -> Tuple[np.ndarray, bool, float]:
        """One optimizer step (0-based ``step``) over ``accumulate_steps`` micro-batches drawn
        from ``batches``: the mean (loss, top1, top5) of this rank, whether the optimizer
        stepped (AMP skips steps with inf/nan gradients), and the lr used."""
        backend, precision, accumulate = self.backend, job.precision, job.plan.accumulate_steps
        lr = lr_at(step, job.total_steps, self.cfg.optim, job.plan.lr)
        backend.set_lr(job.optimizer, lr)
        sums = np.zeros(3)
        for micro in range(1, accumulate + 1):
            images, labels = next(batches)
            # Gradients are averaged across ranks only on the last micro-step.
            sync = contextlib.nullcontext() if micro == accumulate else job.dist.no_sync(job.model)
            with sync:
                with precision.autocast():
                    logits = job.model(precision.convert_input(job.speed.convert_input(images)))
                    loss = backend.loss(logits, labels, self.cfg.optim.label_smoothing)
                precision.backward(loss / accumulate if accumulate > 1 else loss)
            # Reading values back also waits for the device, so the step time is honest.
            sums += (float(backend.to_numpy(loss)), *topk_accuracy(backend.to_numpy(logits), backend.to_numpy(labels)))
        stepped = precision.step(job.optimizer)
        job.optimizer.zero_grad()
        return sums / accumulate, stepped is not False, lr

    def evaluate(self, job: "Job") -> Dict[str, float]:
        """The held-out metrics of the current weights; the model is back in training mode after."""
        result = job.evaluator(job.raw_model, job.precision)
        self.train_mode(job)
        return result

    def _fit(self, dist) -> Dict[str, Any]:
        cfg, backend = self.cfg, self.backend
        job = self.setup(dist)
        plan, precision, total_steps, steps_per_epoch = job.plan, job.precision, job.total_steps, job.steps_per_epoch
        # The history's step times join this run's throughput only if this framework ran them.
        timed_history = own_records(job.history)
        profiler = Profiler(cfg.profiler.warmup_steps, enabled=cfg.profiler.mode != "off", history=timed_history)
        tracer = backend.tracer(cfg.profiler, self.run_dir / f"trace.rank{dist.rank}.json") if cfg.profiler.mode == "trace" else Tracer()
        main = dist.is_main_process
        metrics = MetricsLog(
            self.run_dir / "metrics.jsonl" if main else None, make_sinks(cfg.trainer.loggers, self.run_dir) if main else (), history=job.history
        )
        log.info(
            "%s %s on %s (rank %d of %d), %d thread(s), %s, %d steps of %d samples (%d per device x %d micro-steps), lr %g",
            backend.package, backend.version(), dist.device, dist.rank, dist.world_size, self.threads,
            precision.requested, total_steps, plan.global_batch, plan.micro_batch, plan.accumulate_steps, plan.lr,
        )  # fmt: skip
        progress = StepProgress(total_steps, f"{backend.name} {cfg.model.name}", main and cfg.trainer.progress, cfg.trainer.log_every)
        started, loop_started_at = time.perf_counter(), time.time()
        # A resumed run's clock continues from its checkpoint's, so that time to a target counts
        # the training and evaluation of every step it keeps (not the work lost after the
        # checkpoint, nor the time between the two runs) and the curves against time do not jump back.
        before = max((r.get("elapsed_s", 0.0) for r in job.history), default=0.0)
        step, pending, evaluations = job.start_step, [], list(metrics.evals)
        watch = NonFiniteWatch(cfg.trainer.on_nonfinite, cfg.optim.lr)
        first_epoch, skip = divmod(job.start_step, steps_per_epoch)
        self.train_mode(job)
        tracer.start()
        try:
            for epoch in range(first_epoch, cfg.trainer.epochs):
                # On resume, each rank skips the batches of its own shard it has trained on.
                job.sampler.set_epoch(epoch, start_batch=skip * plan.accumulate_steps if epoch == first_epoch else 0)
                batches = profiler.timed(job.loader)
                while step < (epoch + 1) * steps_per_epoch:
                    local, stepped, lr = self.train_step(job, step, batches)
                    timing = profiler.step(plan.global_batch)
                    tracer.step()
                    step += 1
                    record = {"epoch": epoch, "step": step, "lr": lr, "reader_cost": timing.reader_cost, "batch_cost": timing.batch_cost, "ips": timing.ips, "cpu_cost": timing.cpu_cost}
                    record.update(precision.metrics(), elapsed_s=before + time.perf_counter() - started)
                    pending.append((record, local, stepped))
                    # Logged values are means over all ranks, not rank 0's alone. One all-reduce
                    # per log_every steps: per step, its latency (~1 ms on gloo here) was over 1%
                    # of a data-parallel step.
                    every = cfg.trainer.checkpoint_every
                    checkpoint_now = every and (step % every == 0 or step == total_steps)
                    evaluate_now = job.evaluator is not None and (step == total_steps or (cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0))
                    # Checkpoint and evaluation steps flush too (on every rank: the flush is a
                    # collective), so that no checkpoint holds weights whose loss has not been checked.
                    if not dist.is_distributed or len(pending) >= cfg.trainer.log_every or step % steps_per_epoch == 0 or checkpoint_now or evaluate_now:
                        self._log_pending(dist, pending, metrics, progress, watch)
                    if evaluate_now:
                        result = self.evaluate(job)
                        evaluations.append({"epoch": epoch, "step": step, **result, "elapsed_s": before + time.perf_counter() - started})
                        metrics.append_eval(evaluations[-1])
                        log.info("step %d/%d  held-out: loss %.4f top1 %.4f top5 %.4f (%d samples, %.2f s)", step, total_steps,
                                 result["val_loss"], result["val_top1"], result["val_top5"], result["val_samples"], result["eval_s"])  # fmt: skip
                        profiler.restart_clock()
                    if checkpoint_now and dist.is_main_process:
                        path = save_checkpoint(self.run_dir, step, epoch, backend, job.raw_model, job.raw_optimizer, precision, self._config())
                        prune_checkpoints(self.run_dir, cfg.trainer.keep_checkpoints)
                        log.info("checkpoint: %s", path)
                batches.close()
        finally:
            trace_file = tracer.stop()
            progress.close()
            metrics.close()
        wall = before + time.perf_counter() - started  # the whole run's, on the clock elapsed_s keeps
        trace = self._trace_summary(tracer, trace_file, dist.rank)

        summary = self._summary(dist, precision, plan, metrics, profiler, wall, job.num_classes, len(job.dataset))
        summary.update(
            num_parameters=backend.num_parameters(job.raw_model),
            ranks_in_sync=self._check_ranks_in_sync(dist, job.raw_model),
            trace=trace,
            loop_started_at=loop_started_at,  # wall clock, for start-up time measurements
            memory=self._peak_memory(dist),
            cpu=machine.cpu(),
            data_skipped_files=self._skipped(job),
            eval=self._eval_summary(evaluations),
            tuning=job.speed.describe(),
            # Which framework ran which steps: a run resumed from the other framework's
            # checkpoint holds its steps, clock and evaluations up to the checkpoint.
            steps_by_framework=steps_by_framework(metrics.records, backend.name),
        )
        if dist.is_main_process:
            log.info("\n%s", profiler.format_summary())
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    @staticmethod
    def _skipped(job: "Job") -> Dict[str, Any] | None:
        """Files data.skip_bad_files left out (training and held-out sets), for the record."""
        data = getattr(job.dataset, "dataset", job.dataset)  # under augmentation, the wrapped set
        files = skipped_files(data) + (skipped_files(job.evaluator.dataset) if job.evaluator else [])
        return {"count": len(files), "files": files[:20]} if files else None

    @staticmethod
    def _eval_summary(evaluations: List[Dict[str, Any]]) -> Dict[str, Any] | None:
        """The last held-out result, and the evaluation time apart from training time (a resumed
        run's include the evaluations of the run it continues)."""
        if not evaluations:
            return None
        last = {k: evaluations[-1][k] for k in ("step", "val_loss", "val_top1", "val_top5", "val_samples")}
        return {**last, "evaluations": len(evaluations), "eval_s_total": sum(e.get("eval_s", 0.0) for e in evaluations)}

    @staticmethod
    def _log_pending(dist, pending: list, metrics: MetricsLog, progress: StepProgress, watch: "NonFiniteWatch") -> None:
        """Reduce the pending steps' loss/top1/top5 over ranks in one collective, then log them.

        Every rank gets the same reduced values, so every rank stops at the same step when the
        loss is not finite: none is left waiting in a collective for the others."""
        values = np.atleast_2d(dist.all_reduce(np.stack([local for _, local, _ in pending]), "mean"))
        try:
            for (record, _, stepped), (loss, top1, top5) in zip(pending, values):
                record.update(loss=float(loss), top1=float(top1), top5=float(top5))
                metrics.append(record)
                progress.update(record["step"], record)
                watch.check(record["step"], float(loss), stepped)
        finally:
            pending.clear()

    def _config(self) -> Dict[str, Any]:
        return OmegaConf.to_container(self.cfg, resolve=True, enum_to_str=True) if OmegaConf.is_config(self.cfg) else dataclasses.asdict(self.cfg)

    def _resume(self, model, optimizer, precision) -> Tuple[int, List[Dict[str, Any]]]:
        """Restore ``trainer.resume``'s state into the unwrapped model: the step to continue
        after, and the metrics history up to it (from the run that wrote the checkpoint, its
        records marked with the framework that ran them where that is not this one), so that a
        resumed run's metrics.jsonl holds every step once."""
        spec = self.cfg.trainer.resume
        if not spec:
            return 0, []
        roots = [Path.cwd() / "runs", Path.cwd() / "multirun"]
        fits = {"framework": self.backend.name, "model": self.cfg.model.name}
        path = find_checkpoint(spec, roots, exclude=self.run_dir, fits=fits)
        meta = load_checkpoint(path, self.backend, self.cfg.model.name, model, optimizer, precision)
        step = int(meta["step"])
        log.info("resumed from %s: continuing after step %d", path, step)
        return step, label_history(metrics_history(checkpoint_run_dir(path), step), meta["framework"], self.backend.name)

    def _trace_summary(self, tracer: Tracer, trace_file, rank: int) -> Dict[str, Any] | None:
        """The trace file and its top operators by self time (also as top_ops.rank<r>.md)."""
        if self.cfg.profiler.mode != "trace":
            return None
        if trace_file is None:
            window = f"[{self.cfg.profiler.start}, {self.cfg.profiler.start + self.cfg.profiler.steps})"
            log.warning("profiler.mode=trace: the step window %s was not reached, so no trace was written", window)
            return None
        rows = top_operators(load_events(trace_file), tracer.op_categories, tracer.normalize)
        (self.run_dir / f"top_ops.rank{rank}.md").write_text(operators_markdown(rows) + "\n")
        if rank == 0:
            log.info("top operators by self time (rank 0, steps %d-%d):\n%s", self.cfg.profiler.start + 1,
                     self.cfg.profiler.start + self.cfg.profiler.steps, operators_markdown(rows[:10]))  # fmt: skip
        return {"file": Path(trace_file).name, "top_operators": rows}

    def _peak_memory(self, dist) -> Dict[str, Any]:
        """Peak memory of every rank: host RSS, and the framework's device peak on accelerators."""
        host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        device = self.backend.peak_device_memory_mb(dist.device)
        own = np.zeros((2, dist.world_size))
        own[:, dist.rank] = host, device if device is not None else np.nan
        every = dist.all_reduce(own, "sum")
        return {
            "peak_host_rss_mb": [round(float(v), 1) for v in every[0]],
            "peak_device_mb": None if device is None else [round(float(v), 1) for v in every[1]],
        }

    def _check_ranks_in_sync(self, dist, model) -> bool:
        """Whether every rank ended with bit-identical parameters (they must, in data parallel)."""
        arrays = self.backend.parameter_arrays(model)
        if self.cfg.trainer.save_final_weights:
            np.savez(self.run_dir / f"final_weights.rank{dist.rank}.npz", **arrays)
        values = np.concatenate([a.ravel() for a in arrays.values()]).astype(np.float64)
        # Sums over the finite values plus counts of the others: NaN != NaN would make ranks
        # that diverged identically to NaN look out of sync.
        finite = values[np.isfinite(values)]
        fingerprint = np.array([
            finite.sum(), (finite * finite).sum(), np.abs(finite).sum(),
            np.isnan(values).sum(), np.isposinf(values).sum(), np.isneginf(values).sum(),
        ])  # fmt: skip
        # One collective: the max of (x, -x) gives every rank's largest and smallest value.
        extremes = dist.all_reduce(np.concatenate([fingerprint, -fingerprint]), "max")
        n = len(fingerprint)
        in_sync = bool(np.array_equal(extremes[:n], -extremes[n:]))
        if not in_sync:
            log.warning("parameters differ across ranks at the end of training")
        return in_sync

    def _summary(self, dist, precision, plan: BatchPlan, metrics: MetricsLog, profiler: Profiler, wall: float, num_classes: int, num_samples: int) -> Dict[str, Any]:
        cfg, records = self.cfg, metrics.records
        perf = profiler.summary()
        return {
            "unitrain_version": __version__,
            **self.backend.describe(),
            **dist.describe(),
            "seed": cfg.trainer.seed,
            "model": cfg.model.name,
            "data": cfg.data.name,
            "image_size": cfg.data.image_size,
            "num_classes": num_classes,
            "num_samples": num_samples,
            "batch_size": plan.micro_batch,
            "accumulate_steps": plan.accumulate_steps,
            "global_batch_size": plan.global_batch,
            "lr": plan.lr,
            "lr_scaling": cfg.optim.lr_scaling,
            "steps": len(records),
            "epochs": cfg.trainer.epochs,
            "precision": precision.describe(),
            "malloc": self.malloc,
            "first_loss": records[0]["loss"] if records else None,
            "final": metrics.final(),
            "throughput": {
                "samples_per_s": perf["ips"]["median"] if perf else None,
                "samples_per_s_min": perf["ips"]["min"] if perf else None,
                "samples_per_s_max": perf["ips"]["max"] if perf else None,
                "step_time_s": perf["batch_cost"]["median"] if perf else None,
            },
            "profiler": perf,
            "wall_time_s": wall,
        }
