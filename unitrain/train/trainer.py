"""The one training loop: framework-neutral, it drives any Backend through the interfaces.

:meth:`Trainer.setup` builds a :class:`Job` once (data, sampler, model, optimizer, precision,
wrappers, loaders, evaluator); :meth:`Trainer.train_step` and :meth:`Trainer.evaluate` use it,
and so can anything else that trains or evaluates the same model (quantization-aware training,
benchmarks) instead of copying the loop. After each step the loop decides what is due: logging
(a collective in data parallel), a held-out evaluation, a checkpoint; a non-finite loss stops it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
from omegaconf import OmegaConf

from unitrain.config.schedule import BatchPlan, lr_at
from unitrain.config.schema import UnitrainConfig
from unitrain.data.augment import AugmentedDataset, EpochKeyedBatches
from unitrain.data.datasets import guard
from unitrain.errors import NothingLeftToRun, Refusal, UnitrainError
from unitrain.host import malloc
from unitrain.host.atomic import replace_text
from unitrain.host.console import to_log_file
from unitrain.host.memory import is_out_of_memory
from unitrain.host.threads import export_threads, resolve_threads
from unitrain.interface.backend import Backend, Native, get_backend
from unitrain.interface.data import data_module
from unitrain.interface.distributed import DistributedContext, distributed_module
from unitrain.interface.optim import optim_module
from unitrain.interface.precision import MixedPrecision, precision_module
from unitrain.model.custom import CustomModel, model_ref
from unitrain.spec.models import ViTSpec
from unitrain.tasks import TaskData, task_of
from unitrain.train import summary as summaries
from unitrain.train.checkpoint import (
    checkpoint_home,
    checkpoint_run_dir,
    clean_partial_checkpoints,
    find_checkpoint,
    load_checkpoint,
    nonfinite,
    prune_checkpoints,
    save_checkpoint,
    still_latest,
)
from unitrain.train.evaluation import Evaluator
from unitrain.train.job import Job, sampler_for, training_model
from unitrain.train.loop import Due, Loop, log_pending, start_loop
from unitrain.train.metrics import METRICS, label_history, metrics_history, topk_accuracy
from unitrain.train.run_summary import end_of_run, run_summary

log = logging.getLogger("unitrain")

Record = Dict[str, Any]


def out_of_memory(cfg: UnitrainConfig) -> Refusal:
    """One line for a job that ran out of memory, naming what sizes it: a refusal of its sizes on
    this machine, which leaves nothing behind."""
    size = (
        f"data.image_size={cfg.data.image_size}, trainer.batch_size={cfg.trainer.batch_size}, model={cfg.model.name}, "
        f"data.num_classes={cfg.data.num_classes}"
    )
    return Refusal(f"out of memory ({size}); allowed: a smaller image size, batch, model or number of classes")


def train(cfg: UnitrainConfig, run_dir: str | Path) -> Dict[str, Any]:
    """One process's share of a job: threads, backend, loop. Single-process runs and workers alike."""
    threads = resolve_threads(cfg.trainer.threads, cfg.dist.nproc_per_node)
    export_threads(threads)  # before get_backend imports the framework
    return Trainer(cfg, get_backend(cfg.backend.name), run_dir, threads).fit()


class Trainer:
    """Runs ``cfg`` on ``backend`` and writes metrics.jsonl and summary.json into ``run_dir``."""

    def __init__(
        self,
        cfg: UnitrainConfig,
        backend: Backend,
        run_dir: str | Path,
        threads: int,
        prepare_model: Optional[Callable[[Native], Native]] = None,
        model: Optional[str | ViTSpec | CustomModel] = None,
    ):
        self.cfg, self.backend, self.threads = cfg, backend, threads
        self.run_dir = Path(run_dir)
        # dist.shared_dir over several nodes: every node's restarted workers read it.
        self.checkpoints = checkpoint_home(cfg, self.run_dir)
        self.model_record: Dict[str, Any] = {}  # what a checkpoint keeps to convert its weights
        # Applied to the freshly built model before the optimizer sees its parameters: how
        # quantization-aware training gives the loop a model with fake quantization inserted.
        self.prepare_model = prepare_model
        # The model to build where the config alone would not say it: a checkpoint's, whose
        # translated half is the copy its run kept.
        self.model = model
        self.malloc: Optional[Dict[str, Any]] = None  # what fit() set (unitrain.host.malloc)
        self.task = task_of(cfg)
        self.task_data: Optional[TaskData] = None  # the task's samples, set up by setup()
        self._resume_from: Optional[Path] = None

    def fit(self) -> Dict[str, Any]:
        self.malloc = malloc.apply(self.cfg.trainer.malloc)
        self.backend.set_threads(self.threads)
        self.backend.seed(self.cfg.trainer.seed)
        try:
            with distributed_module(self.backend.name).make_context(self.cfg.dist, self.cfg.backend.device) as dist:
                summary = self._fit(dist)
                # The model, optimizer and DDP wrapper were local to _fit; collect their reference
                # cycles now, while the process group exists. Left to interpreter shutdown, gloo
                # work they hold aborts the process (pytorch/pytorch#179291).
                gc.collect()
        except Exception as err:
            # The frameworks say it in their own words (torch's CPU allocator: a RuntimeError).
            if is_out_of_memory(err) and not isinstance(err, UnitrainError):
                raise out_of_memory(self.cfg) from None
            raise
        return summary

    # --- building the job -----------------------------------------------------------------
    def setup(self, dist: DistributedContext) -> Job:
        """Build everything a run needs, once: data, sampler, model (restored from
        ``trainer.resume``), optimizer, precision, the distributed wrappers, loaders, evaluator."""
        cfg, backend = self.cfg, self.backend
        precision = precision_module(backend.name).make_precision(cfg.amp)
        plan = BatchPlan.from_config(cfg, dist.world_size)
        self.task_data, (sampler, steps_per_epoch) = self._data(dist, plan)
        dataset = self.task_data.train
        total_steps = steps_per_epoch * cfg.trainer.epochs
        num_classes = getattr(dataset, "num_classes", cfg.data.num_classes)
        ref = self.model or model_ref(cfg)
        built = training_model(cfg, backend, ref, num_classes, dist, precision, self.prepare_model)
        self.model_record = built.record
        start_step, history = self._resume(built.model, built.optimizer, precision)
        if start_step >= total_steps:
            # Before metrics.jsonl is opened: the finished run's results stay as they are.
            raise NothingLeftToRun(
                f"the checkpoint is at step {start_step} and this run has {total_steps} steps: nothing left to run; "
                "earlier results are unchanged"
            )
        if dist.is_main_process:
            clean_partial_checkpoints(self.checkpoints)
        if cfg.data.augment != "none":
            dataset, sampler = (
                AugmentedDataset(dataset, cfg.trainer.seed, cfg.data.augment),
                EpochKeyedBatches(sampler, len(dataset)),
            )
        loader = data_module(backend.name).make_loader(dataset, sampler, cfg.data.num_workers, dist.device)
        return Job(
            dist=dist,
            precision=precision,
            plan=plan,
            dataset=dataset,
            sampler=sampler,
            loader=guard(loader, dataset, backend),
            optim=optim_module(backend.name),
            model=built.speed.wrap_model(dist.wrap_model(built.model)),
            optimizer=dist.wrap_optimizer(built.optimizer),
            raw_model=built.model,
            raw_optimizer=built.optimizer,
            steps_per_epoch=steps_per_epoch,
            total_steps=total_steps,
            num_classes=num_classes,
            start_step=start_step,
            history=history,
            evaluator=self._evaluator(dist),
            speed=built.speed,
        )

    def _evaluator(self, dist: DistributedContext) -> Optional[Evaluator]:
        """Held-out evaluation, where the task's data has a held-out set."""
        held_out = self.task_data.held_out if self.task_data is not None else None
        if held_out is None:
            return None
        return Evaluator(self.backend, held_out, dist, self.cfg.trainer.eval_batch_size, self.cfg.data.num_workers)

    def _data(self, dist: DistributedContext, plan: BatchPlan) -> Tuple[TaskData, int]:
        """The task's samples (its training set for this job; a resumed run's saved state, such
        as its tokenizer, reused) and the optimizer steps of an epoch."""
        resumed = self._resume_checkpoint()
        default_size = (self.cfg.trainer.steps or 1) * plan.global_batch
        data = self.task.data(self.cfg, self.run_dir, checkpoint_run_dir(resumed) if resumed else None, default_size)
        return data, sampler_for(self.cfg, len(data.train), dist, plan)

    def _resume_checkpoint(self) -> Optional[Path]:
        """``trainer.resume``'s checkpoint, found once (the corpus's tokenizer is read from its run)."""
        spec = self.cfg.trainer.resume
        if not spec:
            return None
        if self._resume_from is None:
            roots = [Path.cwd() / "runs", Path.cwd() / "multirun"]
            fits = {"framework": self.backend.name, "model": self.cfg.model.name}
            self._resume_from = find_checkpoint(spec, roots, exclude=self.run_dir, fits=fits)
        return self._resume_from

    def _resume(self, model: Native, optimizer: Native, precision: MixedPrecision) -> Tuple[int, List[Record]]:
        """Restore ``trainer.resume``'s state into the unwrapped model: the step to continue
        after, and the metrics history up to it (from the run that wrote the checkpoint, its
        records marked with the framework that ran them where that is not this one), so that a
        resumed run's metrics.jsonl holds every step once."""
        path = self._resume_checkpoint()
        if path is None:
            return 0, []
        meta = load_checkpoint(path, self.backend, self.cfg.model.name, model, optimizer, precision)
        step = int(meta["step"])
        log.info("resumed from %s: continuing after step %d", path, step)
        return step, label_history(
            metrics_history(checkpoint_run_dir(path), step), meta["framework"], self.backend.name
        )

    # --- one step ---------------------------------------------------------------------------
    def train_mode(self, job: Job) -> None:
        job.model.train()
        if self.cfg.model.freeze_bn:
            self.backend.freeze_batchnorm(job.model)

    def train_step(self, job: Job, step: int, batches: Iterator) -> Tuple[np.ndarray, bool, float]:
        """One optimizer step (0-based ``step``) over ``accumulate_steps`` micro-batches drawn
        from ``batches``: the mean (loss, top1, top5) of this rank, whether the optimizer
        stepped (AMP skips steps with inf/nan gradients), and the lr used."""
        backend, precision, accumulate = self.backend, job.precision, job.plan.accumulate_steps
        lr = lr_at(step, job.total_steps, self.cfg.optim, job.plan.lr)
        job.optim.set_lr(job.optimizer, lr)
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

    def evaluate(self, job: Job) -> Dict[str, float]:
        """The held-out metrics of the current weights (a language model's perplexity and bits
        per character or byte too); the model is back in training mode after."""
        assert job.evaluator is not None
        result = job.evaluator(job.raw_model, job.precision)
        self.train_mode(job)
        assert self.task_data is not None
        result.update(self.task.measures(self.task_data, result))
        return result

    # --- the loop ---------------------------------------------------------------------------
    def _fit(self, dist: DistributedContext) -> Dict[str, Any]:
        job = self.setup(dist)
        loop = start_loop(self.cfg, self.backend, job, self.run_dir, self.threads)
        first_epoch, skip = divmod(job.start_step, job.steps_per_epoch)
        self.train_mode(job)
        loop.tracer.start()
        try:
            for epoch in range(first_epoch, self.cfg.trainer.epochs):
                # On resume, each rank skips the batches of its own shard it has trained on.
                job.sampler.set_epoch(
                    epoch, start_batch=skip * job.plan.accumulate_steps if epoch == first_epoch else 0
                )
                self._epoch(job, loop, epoch)
        finally:
            trace = loop.tracer.stop()
            loop.progress.close()
            loop.metrics.close()
        return self._finish(job, loop, trace)

    def _epoch(self, job: Job, loop: Loop, epoch: int) -> None:
        batches = loop.profiler.timed(job.loader)
        while loop.step < (epoch + 1) * job.steps_per_epoch:
            local, stepped, lr = self.train_step(job, loop.step, batches)
            timing = loop.profiler.step(job.plan.global_batch)
            loop.tracer.step()
            loop.step += 1
            record = {
                "epoch": epoch,
                "step": loop.step,
                "lr": lr,
                "reader_cost": timing.reader_cost,
                "batch_cost": timing.batch_cost,
                "ips": timing.ips,
                "cpu_cost": timing.cpu_cost,
            }
            record.update(job.precision.metrics(), elapsed_s=loop.elapsed())
            loop.pending.append((record, local, stepped))
            self._after_step(job, loop, epoch)
        batches.close()

    def _due(self, job: Job, loop: Loop) -> Due:
        trainer, step = self.cfg.trainer, loop.step
        every = trainer.checkpoint_every
        checkpoint = bool(every) and (step % every == 0 or step == job.total_steps)
        evaluate = job.evaluator is not None and (
            step == job.total_steps or bool(trainer.eval_every) and step % trainer.eval_every == 0
        )
        # Logged values are means over all ranks, not rank 0's alone: one all-reduce per
        # log_every steps (per step, its latency was over 1% of a data-parallel step). Checkpoint
        # and evaluation steps flush too (on every rank: the flush is a collective), so that no
        # checkpoint holds weights whose loss has not been checked.
        flush = len(loop.pending) >= trainer.log_every or step % job.steps_per_epoch == 0 or checkpoint or evaluate
        return Due(log=not job.dist.is_distributed or flush, evaluate=evaluate, checkpoint=checkpoint)

    def _after_step(self, job: Job, loop: Loop, epoch: int) -> None:
        due = self._due(job, loop)
        if due.log:
            log_pending(job.dist, loop)
        if due.evaluate:
            self._evaluate_now(job, loop, epoch)
        if due.checkpoint:
            self._checkpoint_now(job, loop, epoch)

    def _checkpoint_now(self, job: Job, loop: Loop, epoch: int) -> None:
        """A checkpoint of weights and optimizer state that are all finite, or none: a loss can be
        finite while the update that followed it was not. Every rank decides alike (they hold the
        same weights), so none waits in a collective for another that stopped."""
        arrays = self.backend.state_arrays(job.raw_model)
        broken = nonfinite(arrays) or job.optim.nonfinite_state(job.raw_optimizer)
        if broken:
            loop.watch.broken_state(loop.step, broken, still_latest(self.checkpoints))
            return
        if job.dist.is_main_process:
            config = self._config()
            path = save_checkpoint(
                self.checkpoints,
                loop.step,
                epoch,
                self.backend,
                arrays,
                job.raw_optimizer,
                job.precision,
                config,
                self.model_record,
            )
            prune_checkpoints(self.checkpoints, self.cfg.trainer.keep_checkpoints)
            if self.checkpoints != self.run_dir:
                # Beside them, the history they continue (a resume reads it where they are).
                replace_text(self.checkpoints / METRICS, (self.run_dir / METRICS).read_text())
            log.info("checkpoint: %s", path)

    def _evaluate_now(self, job: Job, loop: Loop, epoch: int) -> None:
        result = self.evaluate(job)
        loop.evaluations.append({"epoch": epoch, "step": loop.step, **result, "elapsed_s": loop.elapsed()})
        loop.metrics.append_eval(loop.evaluations[-1])
        log.info("step %d/%d  held-out: %s", loop.step, job.total_steps, self.task.evaluation_line(result))
        loop.profiler.restart_clock()

    def _config(self) -> Dict[str, Any]:
        if OmegaConf.is_config(self.cfg):
            return OmegaConf.to_container(self.cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]
        return dataclasses.asdict(self.cfg)

    # --- the end ----------------------------------------------------------------------------
    def _finish(self, job: Job, loop: Loop, trace: Optional[Path]) -> Dict[str, Any]:
        wall = loop.elapsed()  # the whole run's, on the clock elapsed_s keeps
        assert self.task_data is not None
        summary = run_summary(self.cfg, self.backend, job, loop, self.task, self.task_data, self.malloc, wall)
        summary.update(end_of_run(self.cfg, self.backend, job, loop, self.run_dir, trace, loop.tracer))
        if job.dist.is_main_process:
            to_log_file("\n" + loop.profiler.format_summary())
            summaries.write(self.run_dir, summary)
        return summary
