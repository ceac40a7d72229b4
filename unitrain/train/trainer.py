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
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import numpy as np
from omegaconf import OmegaConf

from unitrain.config.schedule import BatchPlan, lr_at
from unitrain.config.schema import UnitrainConfig
from unitrain.data.augment import AugmentedDataset, EpochKeyedBatches
from unitrain.data.datasets import SampleSet, build_dataset, build_heldout_dataset, guard
from unitrain.data.sampler import DistributedBatchSampler
from unitrain.data.text import TextCorpus
from unitrain.errors import ConfigError, NothingLeftToRun, Refusal, UnitrainError
from unitrain.host import machine, malloc
from unitrain.host.atomic import replace_text
from unitrain.host.console import to_log_file
from unitrain.host.memory import is_out_of_memory
from unitrain.host.threads import export_threads, resolve_threads
from unitrain.interface.backend import Backend, Native, get_backend
from unitrain.interface.data import data_module
from unitrain.interface.distributed import DistributedContext, distributed_module
from unitrain.interface.optim import OptimModule, optim_module
from unitrain.interface.precision import MixedPrecision, precision_module
from unitrain.interface.profiler import Tracer, profiler_module
from unitrain.interface.speed_settings import SpeedSettings, make_speed_settings
from unitrain.model.build import build_model
from unitrain.model.conversion import model_record
from unitrain.model.custom import CustomModel, model_ref
from unitrain.spec.models import ViTSpec
from unitrain.train import language
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
from unitrain.train.loggers import make_sinks
from unitrain.train.metrics import (
    METRICS,
    MetricsLog,
    NonFiniteWatch,
    label_history,
    metrics_history,
    own_records,
    steps_by_framework,
    topk_accuracy,
)
from unitrain.train.progress import StepProgress
from unitrain.train.step_timer import Profiler

log = logging.getLogger("unitrain")

Record = Dict[str, Any]
Sampler = Union[DistributedBatchSampler, EpochKeyedBatches]


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


@dataclass(kw_only=True)
class Job:
    """The pieces of a run, built once by :meth:`Trainer.setup` and used by the loop, and by
    anything else that trains or evaluates the same model rather than building its own."""

    dist: DistributedContext
    precision: MixedPrecision
    plan: BatchPlan
    dataset: SampleSet
    sampler: Sampler
    loader: Iterable[Tuple[Native, Native]]
    model: Native  # wrapped for data parallel (and compiled if tuned): train with this one
    optimizer: Native
    raw_model: Native  # unwrapped: evaluate, checkpoint and inspect this one
    raw_optimizer: Native
    optim: OptimModule  # the backend's: the lr is set through it every step
    steps_per_epoch: int
    total_steps: int
    num_classes: int
    start_step: int = 0
    history: List[Record] = field(default_factory=list)  # another framework's records say so (label_history)
    evaluator: Optional[Evaluator] = None
    speed: SpeedSettings = field(default_factory=SpeedSettings)


@dataclass(kw_only=True)
class _Loop:
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
class _Due:
    """What the step just taken calls for."""

    log: bool
    evaluate: bool
    checkpoint: bool


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
        self.text: Optional[TextCorpus] = None  # data=text: the corpus, set up by setup()
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
        dataset, sampler, steps_per_epoch = self._data(dist, plan)
        total_steps = steps_per_epoch * cfg.trainer.epochs
        num_classes = getattr(dataset, "num_classes", cfg.data.num_classes)
        model, optimizer, speed = self._model(dist, precision, num_classes)
        start_step, history = self._resume(model, optimizer, precision)
        if start_step >= total_steps:
            # Before metrics.jsonl is opened: the finished run's results stay as they are.
            raise NothingLeftToRun(
                f"the checkpoint is at step {start_step} and this run has {total_steps} steps: nothing left to run; "
                "earlier results are unchanged"
            )
        if dist.is_main_process:
            clean_partial_checkpoints(self.checkpoints)
        evaluator = self._evaluator(dist)
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
            model=speed.wrap_model(dist.wrap_model(model)),
            optimizer=dist.wrap_optimizer(optimizer),
            raw_model=model,
            raw_optimizer=optimizer,
            steps_per_epoch=steps_per_epoch,
            total_steps=total_steps,
            num_classes=num_classes,
            start_step=start_step,
            history=history,
            evaluator=evaluator,
            speed=speed,
        )

    def _evaluator(self, dist: DistributedContext) -> Optional[Evaluator]:
        """Held-out evaluation, where the data has a held-out set."""
        cfg = self.cfg
        if self.text is not None:
            held_out = language.held_out_windows(self.text, cfg.data.val_samples)
        else:
            held_out = build_heldout_dataset(cfg.data, seed=cfg.trainer.seed)
        if held_out is None:
            return None
        return Evaluator(self.backend, held_out, dist, cfg.trainer.eval_batch_size, cfg.data.num_workers)

    def _data(self, dist: DistributedContext, plan: BatchPlan) -> Tuple[SampleSet, DistributedBatchSampler, int]:
        """The training set, this rank's sampler, and the optimizer steps of an epoch."""
        cfg = self.cfg
        steps = cfg.trainer.steps
        if cfg.data.name == "text":
            resumed = self._resume_checkpoint()
            self.text = language.text_corpus(cfg, self.run_dir, checkpoint_run_dir(resumed) if resumed else None)
            dataset: SampleSet = self.text.train
        else:
            dataset = build_dataset(cfg.data, default_size=(steps or 1) * plan.global_batch, seed=cfg.trainer.seed)
        sampler = DistributedBatchSampler(
            len(dataset),
            plan.micro_batch,
            dist.world_size,
            dist.rank,
            cfg.data.shuffle,
            cfg.trainer.seed,
            cfg.data.drop_last,
            cfg.data.remainder,
            cfg.data.order,
        )
        accumulate = plan.accumulate_steps
        batches_per_epoch = len(sampler) // accumulate
        if batches_per_epoch == 0:
            raise ConfigError(
                "trainer.batch_size",
                cfg.trainer.batch_size,
                f"at most {sampler.per_replica // accumulate} per device and micro-step (each of {dist.world_size} "
                f"process(es) gets {sampler.per_replica} of {len(dataset)} samples) with data.drop_last=true; "
                "use a smaller batch or data.drop_last=false",
            )
        if steps and steps > batches_per_epoch:
            log.warning(
                "trainer.steps=%d but the data holds %d batches per epoch: running %d",
                steps,
                batches_per_epoch,
                batches_per_epoch,
            )
        return dataset, sampler, min(steps or batches_per_epoch, batches_per_epoch)

    def _model(
        self, dist: DistributedContext, precision: MixedPrecision, num_classes: int
    ) -> Tuple[Native, Native, SpeedSettings]:
        """The model and optimizer, prepared (QAT, speed settings) and decorated for precision."""
        cfg, backend = self.cfg, self.backend
        ref = self.model or model_ref(cfg)
        model = build_model(
            backend,
            ref,
            num_classes,
            device=dist.device,
            zero_init_residual=cfg.model.zero_init_residual,
            init=cfg.model.init,
            seed=cfg.trainer.seed,
            dropout=cfg.model.dropout,
        )
        self.model_record = model_record(backend, model, ref, num_classes)
        if self.prepare_model is not None:
            model = self.prepare_model(model)
        speed = make_speed_settings(backend.name, cfg.backend.tuned, dist.device, cfg.backend.tuned_settings)
        model = speed.prepare_model(model)
        optimizer = optim_module(backend.name).build_optimizer(model, cfg.optim)
        model, optimizer = precision.decorate(model, optimizer)
        return model, optimizer, speed

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
        if self.text is not None:
            result.update(language.measures(job.evaluator.dataset, result["val_loss"]))
        return result

    # --- the loop ---------------------------------------------------------------------------
    def _fit(self, dist: DistributedContext) -> Dict[str, Any]:
        job = self.setup(dist)
        loop = self._start(job)
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
            trace_file = loop.tracer.stop()
            loop.progress.close()
            loop.metrics.close()
        return self._finish(job, loop, trace_file)

    def _start(self, job: Job) -> _Loop:
        cfg, backend, dist, plan = self.cfg, self.backend, job.dist, job.plan
        # The history's step times join this run's throughput only if this framework ran them.
        profiler = Profiler(
            cfg.profiler.warmup_steps, enabled=cfg.profiler.mode != "off", history=own_records(job.history)
        )
        trace = cfg.profiler.mode == "trace"
        trace_file = self.run_dir / f"trace.rank{dist.rank}.json"
        tracer = profiler_module(backend.name).make_tracer(cfg.profiler, trace_file) if trace else Tracer()
        main = dist.is_main_process
        sinks = make_sinks(cfg.trainer.loggers, self.run_dir) if main else ()
        metrics = MetricsLog(self.run_dir / METRICS if main else None, sinks, history=job.history)
        log.info(
            "%s %s on %s (rank %d of %d), %d thread(s), %s, %d steps of %d samples (%d per device x %d micro-steps), "
            "lr %g",
            backend.package,
            backend.version(),
            dist.device,
            dist.rank,
            dist.world_size,
            self.threads,
            job.precision.requested,
            job.total_steps,
            plan.global_batch,
            plan.micro_batch,
            plan.accumulate_steps,
            plan.lr,
        )
        warmup = cfg.profiler.warmup_steps
        if cfg.profiler.mode != "off" and warmup and warmup >= job.total_steps and dist.is_main_process:
            log.warning(
                "profiler.warmup_steps=%d leaves none of this run's %d steps after the warm-up: its timing summary "
                "includes the warm-up steps",
                warmup,
                job.total_steps,
            )
        progress = StepProgress(
            job.total_steps, f"{backend.name} {cfg.model.name}", main and cfg.trainer.progress, cfg.trainer.log_every
        )
        return _Loop(
            profiler=profiler,
            tracer=tracer,
            metrics=metrics,
            progress=progress,
            watch=NonFiniteWatch(cfg.trainer.on_nonfinite, cfg.optim.lr),
            step=job.start_step,
            clock_offset=max((r.get("elapsed_s", 0.0) for r in job.history), default=0.0),
            evaluations=list(metrics.evals),
        )

    def _epoch(self, job: Job, loop: _Loop, epoch: int) -> None:
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

    def _due(self, job: Job, loop: _Loop) -> _Due:
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
        return _Due(log=not job.dist.is_distributed or flush, evaluate=evaluate, checkpoint=checkpoint)

    def _after_step(self, job: Job, loop: _Loop, epoch: int) -> None:
        due = self._due(job, loop)
        if due.log:
            self._log_pending(job.dist, loop)
        if due.evaluate:
            self._evaluate_now(job, loop, epoch)
        if due.checkpoint:
            self._checkpoint_now(job, loop, epoch)

    def _checkpoint_now(self, job: Job, loop: _Loop, epoch: int) -> None:
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

    def _evaluate_now(self, job: Job, loop: _Loop, epoch: int) -> None:
        result = self.evaluate(job)
        loop.evaluations.append({"epoch": epoch, "step": loop.step, **result, "elapsed_s": loop.elapsed()})
        loop.metrics.append_eval(loop.evaluations[-1])
        if self.text is not None:
            self._log_text_evaluation(job, loop, result)
        else:
            self._log_evaluation(job, loop, result)
        loop.profiler.restart_clock()

    @staticmethod
    def _log_text_evaluation(job: Job, loop: _Loop, result: Dict[str, float]) -> None:
        unit = next(k for k in result if k.startswith("bits_per_"))
        log.info(
            "step %d/%d  held-out: loss %.4f perplexity %.2f %s %.3f (%d tokens, %.2f s)",
            loop.step,
            job.total_steps,
            result["val_loss"],
            result["perplexity"],
            unit.replace("_", " "),
            result[unit],
            result["val_samples"],
            result["eval_s"],
        )

    @staticmethod
    def _log_evaluation(job: Job, loop: _Loop, result: Dict[str, float]) -> None:
        log.info(
            "step %d/%d  held-out: loss %.4f top1 %.4f top5 %.4f (%d samples, %.2f s)",
            loop.step,
            job.total_steps,
            result["val_loss"],
            result["val_top1"],
            result["val_top5"],
            result["val_samples"],
            result["eval_s"],
        )

    @staticmethod
    def _log_pending(dist: DistributedContext, loop: _Loop) -> None:
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

    def _config(self) -> Dict[str, Any]:
        if OmegaConf.is_config(self.cfg):
            return OmegaConf.to_container(self.cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]
        return dataclasses.asdict(self.cfg)

    # --- the end ----------------------------------------------------------------------------
    def _finish(self, job: Job, loop: _Loop, trace_file: Optional[Path]) -> Dict[str, Any]:
        cfg, backend, dist = self.cfg, self.backend, job.dist
        wall = loop.elapsed()  # the whole run's, on the clock elapsed_s keeps
        profile = cfg.profiler
        window = range(profile.start, profile.start + profile.steps)
        trace = (
            summaries.trace_summary(loop.tracer, trace_file, window, self.run_dir, dist.rank)
            if profile.mode == "trace"
            else None
        )
        summary = self._summary(job, loop, wall)
        summary.update(
            num_parameters=backend.num_parameters(job.raw_model),
            ranks_in_sync=summaries.ranks_in_sync(
                backend, dist, job.raw_model, self.run_dir if cfg.trainer.save_final_weights else None
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
        if dist.is_main_process:
            to_log_file("\n" + loop.profiler.format_summary())
            summaries.write(self.run_dir, summary)
        return summary

    def _summary(self, job: Job, loop: _Loop, wall: float) -> Dict[str, Any]:
        cfg, plan, records = self.cfg, job.plan, loop.metrics.records
        perf = loop.profiler.summary()
        return {
            "unitrain_version": machine.unitrain_version(),
            "host": socket.gethostname(),  # runs on one host at the same time compete (report.fairness)
            **self.backend.describe(),
            **job.dist.describe(),
            "seed": cfg.trainer.seed,
            "model": cfg.model.name,
            "data": cfg.data.name,
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
            "malloc": self.malloc,
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
            **self._text_summary(perf),
        }

    def _text_summary(self, perf: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        """A language model's corpus, tokenizer and tokens/s (every position of a sample is a
        prediction: samples/s x block_size)."""
        if self.text is None:
            return {}
        block = self.text.train.block_size
        return {"text": self.text.summary(), "tokens_per_s": perf["ips"]["median"] * block if perf else None}
