"""Checks of config values that types cannot express: one line naming the key and what is allowed."""

from __future__ import annotations

import math
import os
from typing import Any

from unitrain.config.schedule import BatchPlan
from unitrain.config.schema import (
    AMP_DTYPES, AMP_IMPLS, AMP_LEVELS, DATASET_NAMES, DEVICES, DIST_MODES, GRAD_COMPRESSIONS, LOGGERS, LR_SCALINGS, LR_SCHEDULES,
    NONFINITE_POLICIES, PROFILER_MODES, PS_DATASETS, PS_MODELS, PS_OPTIMIZERS, PS_SYNC_MODES, SAMPLER_ORDERS, SAMPLER_REMAINDERS,
    DistConfig, UnitrainConfig,
)
from unitrain.data.augment import AUGMENTATIONS
from unitrain.host.malloc import MODES as MALLOC_MODES
from unitrain.host.threads import available_cores
from unitrain.model.specs import MODELS
from unitrain.errors import ConfigError


def _one_of(key: str, value: Any, allowed) -> None:
    if value not in allowed:
        raise ConfigError(key, value, f"one of {', '.join(map(str, allowed))}")


def _positive(key: str, value: Any) -> None:
    # nan <= 0 is False, so finiteness is checked on its own.
    if value is None or not math.isfinite(value) or value <= 0:
        raise ConfigError(key, value, "a finite number > 0")


def check_all_reduce_levers(dist: DistConfig | Any, backend: str) -> None:
    """dist.bucket_cap_mb and dist.grad_compression against what the backend's framework offers;
    run before launch and again by a backend's context, for library users who skip validate()."""
    _one_of("dist.grad_compression", dist.grad_compression, GRAD_COMPRESSIONS)
    if dist.grad_compression != "none" and backend == "paddle":
        # fp16_allreduce and DGC in DistributedStrategy are static-graph meta-optimizers; the
        # dynamic graph's DataParallel all-reduces gradients in their own dtype, with no hook.
        raise ConfigError("dist.grad_compression", dist.grad_compression, "none with backend=paddle: Paddle's dynamic-graph DataParallel has no gradient compression")
    if dist.bucket_cap_mb is not None and not dist.bucket_cap_mb > 0:
        raise ConfigError("dist.bucket_cap_mb", dist.bucket_cap_mb, "a size in MB > 0, or null for the framework's default")
    if dist.bucket_cap_mb is not None and backend == "paddle" and dist.bucket_cap_mb != int(dist.bucket_cap_mb):
        raise ConfigError("dist.bucket_cap_mb", dist.bucket_cap_mb, "a whole number of MB with backend=paddle (Fleet's fuse_grad_size_in_MB is an integer)")


def _validate_ps(cfg: UnitrainConfig | Any) -> None:
    ps = cfg.dist.ps
    if cfg.model.name not in PS_MODELS:
        raise ConfigError("model", cfg.model.name, f"{' or '.join(PS_MODELS)} with dist.mode=ps (the ResNets train with dist.mode=collective)")
    if cfg.data.name not in PS_DATASETS:
        raise ConfigError("data", cfg.data.name, f"one of {', '.join(PS_DATASETS)} with dist.mode=ps")
    _one_of("optim.name", cfg.optim.name, PS_OPTIMIZERS)
    if cfg.dist.nproc_per_node != 1 or cfg.dist.nnodes != 1:
        raise ConfigError("dist.nproc_per_node", cfg.dist.nproc_per_node, "1 with dist.mode=ps (dist.ps.servers and dist.ps.trainers size the job, on one node)")
    if ps.servers < 0:
        raise ConfigError("dist.ps.servers", ps.servers, "an integer >= 0 (0: one process without servers)")
    _positive("dist.ps.trainers", ps.trainers)
    if ps.servers == 0 and ps.trainers != 1:
        raise ConfigError("dist.ps.trainers", ps.trainers, "1 with dist.ps.servers=0 (trainers share parameters through servers)")
    _one_of("dist.ps.sync", ps.sync, PS_SYNC_MODES)
    if ps.sync == "geo" and cfg.backend.name == "torch":
        raise ConfigError("dist.ps.sync", "geo", "sync or async with backend=torch (geo-SGD is Paddle's; torch.distributed.rpc has no counterpart)")
    _positive("dist.ps.geo_k_steps", ps.geo_k_steps)
    if cfg.amp.level != "O0":
        raise ConfigError("amp", cfg.amp.level, "O0 with dist.mode=ps (parameter-server jobs train in float32)")
    if cfg.trainer.accumulate_steps != 1:
        raise ConfigError("trainer.accumulate_steps", cfg.trainer.accumulate_steps, "1 with dist.mode=ps")
    _positive("model.sparse_buckets", cfg.model.sparse_buckets)
    _positive("model.embedding_dim", cfg.model.embedding_dim)
    for width in cfg.model.hidden_layers:
        _positive("model.hidden_layers", width)
    if cfg.data.name == "criteo" and not (cfg.data.path and os.path.isfile(cfg.data.path)):
        raise ConfigError("data.path", cfg.data.path, "an existing Criteo TSV file (label, I1..I13, C1..C26 per line) with data=criteo")


def validate(cfg: UnitrainConfig | Any) -> None:
    """Reject values that are well-typed but meaningless, naming the key and what is allowed."""
    _one_of("backend.device", cfg.backend.device, DEVICES)
    _one_of("amp.level", cfg.amp.level, AMP_LEVELS)
    _one_of("amp.dtype", cfg.amp.dtype, AMP_DTYPES)
    _one_of("amp.impl", cfg.amp.impl, AMP_IMPLS)
    if cfg.amp.impl == "apex" and cfg.backend.name != "torch":
        raise ConfigError("amp.impl", "apex", "native with backend=paddle (NVIDIA Apex is a PyTorch extension)")
    _positive("amp.init_loss_scaling", cfg.amp.init_loss_scaling)
    if cfg.amp.incr_ratio <= 1:
        raise ConfigError("amp.incr_ratio", cfg.amp.incr_ratio, "a number > 1")
    if not 0 < cfg.amp.decr_ratio < 1:
        raise ConfigError("amp.decr_ratio", cfg.amp.decr_ratio, "a number in (0, 1)")
    _positive("amp.incr_every_n_steps", cfg.amp.incr_every_n_steps)
    _positive("amp.decr_every_n_nan_or_inf", cfg.amp.decr_every_n_nan_or_inf)
    _one_of("model.name", cfg.model.name, MODELS.names() + list(PS_MODELS))
    _one_of("model.init", cfg.model.init, ("framework", "shared"))
    _one_of("data.name", cfg.data.name, DATASET_NAMES + PS_DATASETS)
    _positive("data.image_size", cfg.data.image_size)
    if cfg.data.num_classes < 2:
        raise ConfigError("data.num_classes", cfg.data.num_classes, "an integer >= 2 (a classifier needs two classes)")
    if cfg.data.num_samples is not None:
        _positive("data.num_samples", cfg.data.num_samples)
    if cfg.data.num_workers < 0:
        raise ConfigError("data.num_workers", cfg.data.num_workers, "an integer >= 0")
    _one_of("data.augment", cfg.data.augment, AUGMENTATIONS)
    _one_of("data.remainder", cfg.data.remainder, SAMPLER_REMAINDERS)
    _one_of("data.order", cfg.data.order, SAMPLER_ORDERS)
    if cfg.data.name == "imagefolder":
        if not cfg.data.path:
            raise ConfigError("data.path", cfg.data.path, "a directory of class sub-directories (data=imagefolder)")
        if not os.path.isdir(cfg.data.path):
            raise ConfigError("data.path", cfg.data.path, "an existing directory of class sub-directories")
    _one_of("dist.mode", cfg.dist.mode, DIST_MODES)
    if cfg.dist.mode == "ps":
        _validate_ps(cfg)
    else:
        if cfg.model.name in PS_MODELS:
            raise ConfigError("model", cfg.model.name, f"one of {', '.join(MODELS.names())} with dist.mode=collective ({cfg.model.name} trains with dist.mode=ps)")
        if cfg.data.name in PS_DATASETS:
            raise ConfigError("data", cfg.data.name, f"one of {', '.join(DATASET_NAMES)} with dist.mode=collective ({cfg.data.name} is for dist.mode=ps)")
        _one_of("optim.name", cfg.optim.name, ("momentum",))
    _positive("optim.lr", cfg.optim.lr)
    if not 0 <= cfg.optim.momentum < 1:  # also false for nan
        raise ConfigError("optim.momentum", cfg.optim.momentum, "a number in [0, 1)")
    if not math.isfinite(cfg.optim.weight_decay) or cfg.optim.weight_decay < 0:
        raise ConfigError("optim.weight_decay", cfg.optim.weight_decay, "a number >= 0")
    _one_of("optim.schedule", cfg.optim.schedule, LR_SCHEDULES)
    _one_of("optim.lr_scaling", cfg.optim.lr_scaling, LR_SCALINGS)
    if cfg.optim.warmup_steps < 0:
        raise ConfigError("optim.warmup_steps", cfg.optim.warmup_steps, "an integer >= 0")
    _positive("optim.step_size", cfg.optim.step_size)
    if not 0 <= cfg.optim.label_smoothing < 1:
        raise ConfigError("optim.label_smoothing", cfg.optim.label_smoothing, "a number in [0, 1)")
    if cfg.optim.clip_grad_norm is not None:
        _positive("optim.clip_grad_norm", cfg.optim.clip_grad_norm)
    if cfg.optim.nesterov and cfg.optim.momentum == 0:
        raise ConfigError("optim.nesterov", True, "false when optim.momentum=0 (Nesterov needs momentum)")
    if cfg.trainer.steps is not None:
        _positive("trainer.steps", cfg.trainer.steps)
    _positive("trainer.epochs", cfg.trainer.epochs)
    if cfg.trainer.seed < 0:
        raise ConfigError("trainer.seed", cfg.trainer.seed, "an integer >= 0 (NumPy seeds the data order and shared weights with it)")
    _positive("trainer.batch_size", cfg.trainer.batch_size)
    if cfg.trainer.threads is not None:
        _positive("trainer.threads", cfg.trainer.threads)
        cores = available_cores()
        if cfg.trainer.threads > cores:
            # Oversubscribed threads measure contention, not the framework (1000 threads ran
            # ~0.1% of the speed of 2 here).
            raise ConfigError("trainer.threads", cfg.trainer.threads, f"at most {cores}, the cores this process may use (or unset: all of them)")
    if cfg.trainer.eval_every < 0:
        raise ConfigError("trainer.eval_every", cfg.trainer.eval_every, "an integer >= 0 (0: evaluate only at the end)")
    _positive("trainer.eval_batch_size", cfg.trainer.eval_batch_size)
    if cfg.data.val_samples < 0:
        raise ConfigError("data.val_samples", cfg.data.val_samples, "an integer >= 0 (0: no held-out set)")
    if cfg.data.val_path is not None and not os.path.isdir(cfg.data.val_path):
        raise ConfigError("data.val_path", cfg.data.val_path, "an existing directory of class sub-directories")
    if cfg.trainer.checkpoint_every < 0:
        raise ConfigError("trainer.checkpoint_every", cfg.trainer.checkpoint_every, "an integer >= 0 (0: no checkpoints)")
    if cfg.trainer.keep_checkpoints < 0:
        raise ConfigError("trainer.keep_checkpoints", cfg.trainer.keep_checkpoints, "an integer >= 0 (0: keep every checkpoint)")
    _one_of("trainer.on_nonfinite", cfg.trainer.on_nonfinite, NONFINITE_POLICIES)
    _one_of("trainer.malloc", cfg.trainer.malloc, MALLOC_MODES)
    _positive("trainer.log_every", cfg.trainer.log_every)
    _positive("trainer.accumulate_steps", cfg.trainer.accumulate_steps)
    _positive("trainer.repeats", cfg.trainer.repeats)
    for name in cfg.trainer.loggers:
        _one_of("trainer.loggers", name, LOGGERS)
    if cfg.data.sample_delay_s < 0:
        raise ConfigError("data.sample_delay_s", cfg.data.sample_delay_s, "a number of seconds >= 0")
    _positive("dist.nproc_per_node", cfg.dist.nproc_per_node)
    _positive("dist.nnodes", cfg.dist.nnodes)
    if not 0 <= cfg.dist.node_rank < cfg.dist.nnodes:
        raise ConfigError("dist.node_rank", cfg.dist.node_rank, f"an integer in [0, {cfg.dist.nnodes}) (dist.nnodes={cfg.dist.nnodes})")
    if cfg.dist.nnodes > 1 and cfg.dist.master_port is None:
        raise ConfigError("dist.master_port", None, "a port number that every node uses, when dist.nnodes > 1")
    if cfg.dist.master_port is not None and not 0 < cfg.dist.master_port < 65536:
        raise ConfigError("dist.master_port", cfg.dist.master_port, "a port number in 1..65535")
    world = cfg.dist.nproc_per_node * cfg.dist.nnodes * cfg.trainer.accumulate_steps
    if cfg.optim.lr_scaling == "keep_global" and cfg.trainer.batch_size % world:
        raise ConfigError(
            "trainer.batch_size", cfg.trainer.batch_size,
            f"a multiple of {world} (processes x accumulate_steps) with optim.lr_scaling=keep_global",
        )  # fmt: skip
    _one_of("dist.comm_backend", cfg.dist.comm_backend, ("auto", "gloo", "nccl"))
    check_all_reduce_levers(cfg.dist, cfg.backend.name)
    _positive("dist.timeout_s", cfg.dist.timeout_s)
    micro = BatchPlan.micro_batch_of(cfg, cfg.dist.nproc_per_node * cfg.dist.nnodes)
    if micro < 2 and not cfg.model.freeze_bn:
        raise ConfigError(
            "trainer.batch_size", cfg.trainer.batch_size,
            f"at least 2 samples per device and micro-step (this gives {micro}): BatchNorm cannot train on one sample; "
            "or model.freeze_bn=true",
        )  # fmt: skip
    _one_of("profiler.mode", cfg.profiler.mode, PROFILER_MODES)
    if cfg.profiler.warmup_steps < 0:
        raise ConfigError("profiler.warmup_steps", cfg.profiler.warmup_steps, "an integer >= 0")
    if cfg.profiler.start < 0:
        raise ConfigError("profiler.start", cfg.profiler.start, "a step number >= 0")
    _positive("profiler.steps", cfg.profiler.steps)
