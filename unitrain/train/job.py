"""A run's pieces, built once by the Trainer and used by its loop (and by anything else that
trains or evaluates the same model, such as quantization-aware training): the :class:`Job`, the
sampler and the steps of an epoch, and the model with its optimizer, prepared and decorated."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from unitrain.config.schedule import BatchPlan
from unitrain.data.augment import EpochKeyedBatches
from unitrain.data.datasets import SampleSet
from unitrain.data.sampler import DistributedBatchSampler
from unitrain.errors import ConfigError
from unitrain.interface.backend import Backend, Native
from unitrain.interface.distributed import DistributedContext
from unitrain.interface.optim import OptimModule, optim_module
from unitrain.interface.precision import MixedPrecision
from unitrain.interface.speed_settings import SpeedSettings, make_speed_settings
from unitrain.model.build import build_model
from unitrain.model.conversion import model_record
from unitrain.train.evaluation import Evaluator

log = logging.getLogger("unitrain")

Record = Dict[str, Any]
Sampler = Union[DistributedBatchSampler, EpochKeyedBatches]


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


def sampler_for(cfg: Any, size: int, dist: DistributedContext, plan: BatchPlan) -> Tuple[DistributedBatchSampler, int]:
    """This rank's sampler over ``size`` samples, and the optimizer steps of an epoch."""
    steps = cfg.trainer.steps
    sampler = DistributedBatchSampler(
        size,
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
            f"process(es) gets {sampler.per_replica} of {size} samples) with data.drop_last=true; "
            "use a smaller batch or data.drop_last=false",
        )
    if steps and steps > batches_per_epoch:
        log.warning(
            "trainer.steps=%d but the data holds %d batches per epoch: running %d",
            steps,
            batches_per_epoch,
            batches_per_epoch,
        )
    return sampler, min(steps or batches_per_epoch, batches_per_epoch)


@dataclass
class BuiltModel:
    """The model and optimizer as the loop gets them, the speed settings applied to them, and
    what a checkpoint keeps to convert the weights."""

    model: Native
    optimizer: Native
    speed: SpeedSettings
    record: Dict[str, Any]


def training_model(
    cfg: Any,
    backend: Backend,
    ref: Any,
    num_classes: int,
    dist: DistributedContext,
    precision: MixedPrecision,
    prepare_model: Optional[Callable[[Native], Native]] = None,
) -> BuiltModel:
    """The model and optimizer, prepared (QAT, speed settings) and decorated for precision."""
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
    record = model_record(backend, model, ref, num_classes)
    if prepare_model is not None:
        model = prepare_model(model)
    speed = make_speed_settings(backend.name, cfg.backend.tuned, dist.device, cfg.backend.tuned_settings)
    model = speed.prepare_model(model)
    optimizer = optim_module(backend.name).build_optimizer(model, cfg.optim)
    model, optimizer = precision.decorate(model, optimizer)
    return BuiltModel(model=model, optimizer=optimizer, speed=speed, record=record)
