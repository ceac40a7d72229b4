"""The config rules every job follows: ranges and settings that exclude each other, checks of
values that types cannot express. Each refusal is one ConfigError naming the key and what is
allowed.

Hydra has already refused wrong keys, wrong types and choices outside their Enum (the schema).
These rules read the config alone: what a kind of job adds (``unitrain.jobs``), what this
machine allows (cores, memory, files) and what a backend cannot do (its ``validation.py``) are
checked beside them, by ``unitrain.jobs.select.validate``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Iterable, Optional, Tuple

from omegaconf import OmegaConf

from unitrain import tasks
from unitrain.config.schedule import BatchPlan
from unitrain.config.schema import (
    AmpConfig,
    DataConfig,
    DistConfig,
    OptimConfig,
    ParityConfig,
    ProfilerConfig,
    TrainerConfig,
    UnitrainConfig,
)
from unitrain.data.augment import AUGMENTATIONS
from unitrain.errors import ConfigError
from unitrain.spec.hf import HF
from unitrain.spec.models import CUSTOM, MODELS, GPTSpec, ResNetSpec, ViTSpec
from unitrain.spec.optimizers import ADAPTIVE
from unitrain.tasks import Measure, Task

#: Restarts of failed workers a job may ask for (dist.max_restarts).
MAX_RESTARTS = 100
#: Repeats of one job (trainer.repeats) and micro-steps of one optimizer step (trainer.accumulate_steps).
MAX_REPEATS, MAX_ACCUMULATE = 100, 1024
#: The first loss scale and its growth factor (float16's range ends at 65504).
MAX_LOSS_SCALE, MAX_SCALE_RATIO = 2.0**24, 1024.0
#: Overflowing (skipped) steps in a row before the loss scale backs off.
MAX_OVERFLOWS = 1000
#: Seconds a sample may be made to wait (data.sample_delay_s, a stand-in for a slow disk).
MAX_SAMPLE_DELAY_S = 60.0
#: Where float32 updates give out (float32 ends at 3.4e38: lr times a gradient overflows): larger is
#: not a learning rate. (Anything near it diverges at once; the tests use that to force a NaN.)
MAX_LR = 1e30
#: Nodes one job may span.
MAX_NODES = 1024
#: Seconds a node waits for the others (dist.timeout_s): a day.
MAX_TIMEOUT_S = 86400.0
SHARED_DIR_ALLOWED = (
    "an absolute path to an existing directory that every node reaches at that path (a network file system)"
)


def one_of(key: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(key, value, f"one of {', '.join(map(str, allowed))}")


def positive(key: str, value: Any) -> None:
    # nan <= 0 is False, so finiteness is checked on its own.
    if value is None or not math.isfinite(value) or value <= 0:
        raise ConfigError(key, value, "a finite number > 0")


def at_least(key: str, value: int, least: int, why: str = "") -> None:
    if value < least:
        raise ConfigError(key, value, f"an integer >= {least}" + (f" ({why})" if why else ""))


def not_empty(key: str, value: Any) -> None:
    """A path, a host or an import path given as "" is a mistake, not a choice: null unsets it."""
    if value is not None and not str(value).strip():
        raise ConfigError(key, value, "unset (null) or not empty")


def check_all_reduce_levers(dist: DistConfig) -> None:
    """dist.bucket_cap_mb as every backend takes it; a backend's own limits are its validation
    module's (run again by its context, for library users who skip validate())."""
    if dist.bucket_cap_mb is not None and not (math.isfinite(dist.bucket_cap_mb) and dist.bucket_cap_mb > 0):
        raise ConfigError(
            "dist.bucket_cap_mb", dist.bucket_cap_mb, "a size in MB > 0, or null for the framework's default"
        )


def _check_amp(amp: AmpConfig) -> None:
    positive("amp.init_loss_scaling", amp.init_loss_scaling)
    if amp.init_loss_scaling > MAX_LOSS_SCALE:
        # float16 ends at 65504: a larger first scale only overflows, step after skipped step.
        raise ConfigError("amp.init_loss_scaling", amp.init_loss_scaling, f"a number in (0, {MAX_LOSS_SCALE:g}]")
    if not (math.isfinite(amp.incr_ratio) and 1 < amp.incr_ratio <= MAX_SCALE_RATIO):
        raise ConfigError("amp.incr_ratio", amp.incr_ratio, f"a number > 1, at most {MAX_SCALE_RATIO:g}")
    if not 0 < amp.decr_ratio < 1:
        raise ConfigError("amp.decr_ratio", amp.decr_ratio, "a number in (0, 1)")
    positive("amp.incr_every_n_steps", amp.incr_every_n_steps)
    positive("amp.decr_every_n_nan_or_inf", amp.decr_every_n_nan_or_inf)
    if amp.decr_every_n_nan_or_inf > MAX_OVERFLOWS:
        # Every step that overflows is skipped: a scale that waits longer never trains.
        raise ConfigError(
            "amp.decr_every_n_nan_or_inf", amp.decr_every_n_nan_or_inf, f"at most {MAX_OVERFLOWS} overflowing steps"
        )


def _check_data(data: DataConfig, task: Task) -> None:
    positive("data.image_size", data.image_size)
    for key in ("path", "val_path"):
        not_empty(f"data.{key}", getattr(data, key))
    at_least("data.num_classes", data.num_classes, 2, "a classifier needs two classes")
    if data.num_samples is not None:
        positive("data.num_samples", data.num_samples)
    at_least("data.num_workers", data.num_workers, 0)
    one_of("data.augment", data.augment, AUGMENTATIONS)
    at_least("data.val_samples", data.val_samples, 0, task.val_samples_zero)
    if not (math.isfinite(data.sample_delay_s) and 0 <= data.sample_delay_s <= MAX_SAMPLE_DELAY_S):
        raise ConfigError(
            "data.sample_delay_s", data.sample_delay_s, f"a number of seconds from 0 to {MAX_SAMPLE_DELAY_S:g}"
        )


def _check_model(cfg: UnitrainConfig | ParityConfig) -> None:
    spec = MODELS.get(cfg.model.name) if cfg.model.name in MODELS else None
    if not 0 <= cfg.model.dropout < 1:  # also false for nan
        raise ConfigError("model.dropout", cfg.model.dropout, "a probability in [0, 1)")
    if cfg.model.dropout and not isinstance(spec, GPTSpec):
        raise ConfigError(
            "model.dropout", cfg.model.dropout, f"0 with model={cfg.model.name} (only gpt_* models read it)"
        )
    if cfg.model.path is not None and cfg.model.name != HF:
        raise ConfigError("model.path", cfg.model.path, f"unset with model={cfg.model.name} (only model=hf reads it)")


def _check_optim(optim: OptimConfig) -> None:
    positive("optim.lr", optim.lr)
    if optim.lr > MAX_LR:
        raise ConfigError("optim.lr", optim.lr, f"a number in (0, {MAX_LR:g}]")
    if not 0 <= optim.momentum < 1:  # also false for nan
        raise ConfigError("optim.momentum", optim.momentum, "a number in [0, 1)")
    if not (math.isfinite(optim.weight_decay) and 0 <= optim.weight_decay <= 1):
        # Above 1 the decay alone flips the weights' sign at any lr near 1.
        raise ConfigError("optim.weight_decay", optim.weight_decay, "a number in [0, 1]")
    at_least("optim.warmup_steps", optim.warmup_steps, 0)
    positive("optim.step_size", optim.step_size)
    if not (math.isfinite(optim.gamma) and 0 < optim.gamma <= 1):
        raise ConfigError(
            "optim.gamma", optim.gamma, "a number in (0, 1]: the factor the step schedule multiplies the lr by"
        )
    if not 0 <= optim.label_smoothing < 1:
        raise ConfigError("optim.label_smoothing", optim.label_smoothing, "a number in [0, 1)")
    if optim.clip_grad_norm is not None:
        positive("optim.clip_grad_norm", optim.clip_grad_norm)
    _check_adaptive(optim)
    if optim.nesterov and optim.momentum == 0:
        raise ConfigError("optim.nesterov", True, "false when optim.momentum=0 (Nesterov needs momentum)")
    if not (math.isfinite(optim.min_lr_ratio) and 0 <= optim.min_lr_ratio <= 1):
        raise ConfigError(
            "optim.min_lr_ratio", optim.min_lr_ratio, "a number in [0, 1]: the cosine schedule's last lr over its peak"
        )
    if optim.min_lr_ratio and optim.schedule != "cosine":
        raise ConfigError(
            "optim.min_lr_ratio",
            optim.min_lr_ratio,
            f"0 with optim.schedule={optim.schedule} (only the cosine schedule reads it; optim=adamw sets 0.1)",
        )


#: The values adam and adamw read, as the schema's defaults (the others must leave them so).
_ADAPTIVE_DEFAULTS = {key: getattr(OptimConfig, key) for key in ("beta1", "beta2", "eps")}


def _check_adaptive(optim: OptimConfig) -> None:
    """Adam's keys in their ranges, and each optimizer given only the keys it reads."""
    for key in ("beta1", "beta2"):
        if not 0 <= getattr(optim, key) < 1:  # also false for nan
            raise ConfigError(f"optim.{key}", getattr(optim, key), "a number in [0, 1): a moment's decay rate")
    if not (math.isfinite(optim.eps) and 0 < optim.eps <= 1):
        # Above 1 it no longer guards a denominator but replaces it; 1e300 is inf in float32.
        raise ConfigError("optim.eps", optim.eps, "a number in (0, 1]: the denominator's epsilon")
    name = str(optim.name)
    if name in ADAPTIVE:
        if optim.nesterov:
            raise ConfigError("optim.nesterov", True, f"false with optim.name={name} (Nesterov is momentum's)")
        if optim.momentum:
            raise ConfigError(
                "optim.momentum", optim.momentum, f"0 with optim.name={name} (its first moment's rate is optim.beta1)"
            )
        return
    if name == "sgd" and optim.momentum:
        raise ConfigError(
            "optim.momentum",
            optim.momentum,
            "0 with optim.name=sgd (plain SGD has none; optim=momentum has, where the job's kind builds it)",
        )
    for key, default in _ADAPTIVE_DEFAULTS.items():
        if getattr(optim, key) != default:
            raise ConfigError(
                f"optim.{key}",
                getattr(optim, key),
                f"{default:g} (its default) with optim.name={name}: only {' and '.join(ADAPTIVE)} read it",
            )


def _check_trainer(trainer: TrainerConfig) -> None:
    if trainer.steps is not None:
        positive("trainer.steps", trainer.steps)
    positive("trainer.epochs", trainer.epochs)
    if not 0 <= trainer.seed < 2**32:
        raise ConfigError(
            "trainer.seed", trainer.seed, "an integer in [0, 2**32): the frameworks' and NumPy's seeds are 32-bit"
        )
    positive("trainer.batch_size", trainer.batch_size)
    if trainer.threads is not None:
        positive("trainer.threads", trainer.threads)
    at_least("trainer.eval_every", trainer.eval_every, 0, "0: evaluate only at the end")
    positive("trainer.eval_batch_size", trainer.eval_batch_size)
    at_least("trainer.checkpoint_every", trainer.checkpoint_every, 0, "0: no checkpoints")
    at_least("trainer.keep_checkpoints", trainer.keep_checkpoints, 0, "0: keep every checkpoint")
    positive("trainer.log_every", trainer.log_every)
    positive("trainer.accumulate_steps", trainer.accumulate_steps)
    if trainer.accumulate_steps > MAX_ACCUMULATE:
        raise ConfigError(
            "trainer.accumulate_steps", trainer.accumulate_steps, f"at most {MAX_ACCUMULATE} micro-steps a step"
        )
    positive("trainer.repeats", trainer.repeats)
    if trainer.repeats > MAX_REPEATS:
        raise ConfigError("trainer.repeats", trainer.repeats, f"at most {MAX_REPEATS} runs of the job")
    not_empty("trainer.resume", trainer.resume)


def _check_dist(cfg: UnitrainConfig) -> None:
    dist = cfg.dist
    positive("dist.nproc_per_node", dist.nproc_per_node)
    positive("dist.nnodes", dist.nnodes)
    if dist.nnodes > MAX_NODES:
        raise ConfigError("dist.nnodes", dist.nnodes, f"at most {MAX_NODES} nodes")
    if not 0 <= dist.node_rank < dist.nnodes:
        raise ConfigError(
            "dist.node_rank", dist.node_rank, f"an integer in [0, {dist.nnodes}) (dist.nnodes={dist.nnodes})"
        )
    if dist.nnodes > 1 and dist.master_port is None:
        raise ConfigError("dist.master_port", None, "a port number that every node uses, when dist.nnodes > 1")
    if dist.master_port is not None and not 0 < dist.master_port < 65536:
        raise ConfigError("dist.master_port", dist.master_port, "a port number in 1..65535")
    world = dist.nproc_per_node * dist.nnodes * cfg.trainer.accumulate_steps
    if cfg.optim.lr_scaling == "keep_global" and cfg.trainer.batch_size % world:
        raise ConfigError(
            "trainer.batch_size",
            cfg.trainer.batch_size,
            f"a multiple of {world} (processes x accumulate_steps) with optim.lr_scaling=keep_global",
        )
    check_all_reduce_levers(dist)
    positive("dist.timeout_s", dist.timeout_s)
    if dist.timeout_s > MAX_TIMEOUT_S:
        raise ConfigError("dist.timeout_s", dist.timeout_s, f"at most {MAX_TIMEOUT_S:g} seconds (a day)")
    not_empty("dist.master_addr", dist.master_addr)
    not_empty("dist.interface", dist.interface)
    _check_restarts(cfg)
    _check_batch_per_device(cfg)


def _check_restarts(cfg: UnitrainConfig) -> None:
    """dist.max_restarts and dist.shared_dir, where restarted workers find their checkpoints."""
    dist = cfg.dist
    at_least("dist.max_restarts", dist.max_restarts, 0)
    if dist.max_restarts > MAX_RESTARTS:
        # A worker that fails that often is not meeting transient faults: it is broken.
        raise ConfigError(
            "dist.max_restarts", dist.max_restarts, f"at most {MAX_RESTARTS} (restarts of failed workers in one job)"
        )
    _check_shared_dir(dist)
    if dist.shared_dir is not None and dist.nnodes == 1 and not cfg.trainer.checkpoint_every and not dist.max_restarts:
        raise ConfigError(
            "dist.shared_dir",
            dist.shared_dir,
            "unset on one node without checkpoints or restarts (it holds the job's checkpoints: read with "
            "trainer.checkpoint_every, dist.max_restarts or dist.nnodes > 1)",
        )
    if dist.max_restarts and dist.nnodes > 1 and not dist.shared_dir:
        # A restarted worker on another node resumes from the checkpoint rank 0 wrote.
        raise ConfigError(
            "dist.max_restarts",
            dist.max_restarts,
            "0 with dist.nnodes > 1, unless dist.shared_dir names a directory every node reaches at the same path "
            "(where rank 0's checkpoints are read by a worker restarted on any node)",
        )


def _check_batch_per_device(cfg: UnitrainConfig) -> None:
    dist = cfg.dist
    micro = BatchPlan.micro_batch_of(cfg, dist.nproc_per_node * dist.nnodes)
    spec = MODELS.get(cfg.model.name) if cfg.model.name in MODELS else None
    with_batchnorm = isinstance(spec, ResNetSpec) or cfg.model.name == CUSTOM
    if micro < 2 and with_batchnorm and not cfg.model.freeze_bn:
        raise ConfigError(
            "trainer.batch_size",
            cfg.trainer.batch_size,
            f"at least 2 samples per device and micro-step (this gives {micro}): BatchNorm cannot train on one sample; "
            "or model.freeze_bn=true",
        )


def changed_from_schema(group: Any, schema: type) -> Optional[Tuple[str, Any]]:
    """The first key of a config group whose value is not its schema's default, with that value
    (a list as a list); None where every key is as the schema has it: how a group that a job
    does not read is told apart from one the user set."""
    defaults = schema()
    for field in dataclasses.fields(schema):
        value = getattr(group, field.name)
        value = OmegaConf.to_object(value) if OmegaConf.is_config(value) else value
        if value != getattr(defaults, field.name):
            return field.name, list(value) if isinstance(value, (list, tuple)) else value
    return None


def _check_shared_dir(dist: DistConfig) -> None:
    """Every node names the same directory the same way (its existence is the machine's check)."""
    if dist.shared_dir is None:
        return
    not_empty("dist.shared_dir", dist.shared_dir)
    if not os.path.isabs(dist.shared_dir):
        raise ConfigError("dist.shared_dir", dist.shared_dir, SHARED_DIR_ALLOWED)


def _check_profiler(profiler: ProfilerConfig) -> None:
    at_least("profiler.warmup_steps", profiler.warmup_steps, 0)
    if profiler.start < 0:
        raise ConfigError("profiler.start", profiler.start, "a step number >= 0")
    positive("profiler.steps", profiler.steps)


def check_image_model(name: str, image_size: int, freeze_bn: bool) -> None:
    """A built-in image model for these images: a ViT's patches tile them, and it has no
    BatchNorm to freeze."""
    spec = MODELS.get(name) if name in MODELS else None
    if not isinstance(spec, ViTSpec):
        return
    if image_size % spec.patch:
        raise ConfigError("data.image_size", image_size, f"a multiple of {name}'s patch size {spec.patch}")
    if freeze_bn:
        raise ConfigError("model.freeze_bn", True, f"false with {name} (a Vision Transformer has no BatchNorm)")


def check_groups(cfg: UnitrainConfig | ParityConfig) -> None:
    """The rules of the groups every command that trains has: model, data, optim, trainer."""
    not_empty("model.mapping", cfg.model.mapping)
    # The task's rules first (a language model trains on text, a corpus's path is a file or a
    # folder, ...), each other task's keys unset; then the ranges every job's data has.
    tasks.check(cfg)
    _check_data(cfg.data, tasks.task_of(cfg))
    _check_model(cfg)
    _check_optim(cfg.optim)
    _check_trainer(cfg.trainer)


def check_config(cfg: UnitrainConfig) -> None:
    """Refuse values that are well-typed but meaningless, whatever the kind of job, naming the
    key and what is allowed."""
    check_groups(cfg)
    _check_amp(cfg.amp)
    _check_dist(cfg)
    _check_profiler(cfg.profiler)
    _check_objective(cfg.objective, tasks.task_of(cfg).measure)


def _check_objective(objective: Any, measure: Measure) -> None:
    target = objective.target
    if objective.metric == "time_to_target":
        measure.check_target(target)
    elif target is not None:
        raise ConfigError("objective.target", target, "null with objective.metric=heldout (it reads no target)")
