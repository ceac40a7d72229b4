"""The checks of config values that types cannot express: ranges, paths, and settings that
exclude each other. Each refusal is one ConfigError naming the key and what is allowed.

Hydra has already refused wrong keys, wrong types and choices outside their Enum (the schema);
a backend's own limits are its ``validation.py``'s, called last.
"""

from __future__ import annotations

import importlib.util
import math
import os
from typing import Any, Iterable

from unitrain.config.schedule import BatchPlan
from unitrain.config.schema import DATASET_NAMES, PS_DATASETS, PS_MODELS, PS_OPTIMIZERS, DistConfig
from unitrain.data import criteo_files
from unitrain.data.augment import AUGMENTATIONS
from unitrain.errors import ConfigError
from unitrain.host.memory import available_mb
from unitrain.host.threads import available_cores
from unitrain.interface.ps import PsLayout
from unitrain.interface.validation import validation_module
from unitrain.model.custom import CUSTOM
from unitrain.model.specs import MODELS, ViTSpec

#: Loader worker processes per core beyond which they only contend.
MAX_WORKERS_PER_CORE = 4
#: Training processes (workers, servers, trainers) per core a job may start on a CPU: each is a
#: Python process with its framework loaded (150 MB or more), and past a few per core they
#: measure contention. More than one per core draws a warning at launch.
MAX_PROCESSES_PER_CORE = 8


def _one_of(key: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(key, value, f"one of {', '.join(map(str, allowed))}")


def _positive(key: str, value: Any) -> None:
    # nan <= 0 is False, so finiteness is checked on its own.
    if value is None or not math.isfinite(value) or value <= 0:
        raise ConfigError(key, value, "a finite number > 0")


def _at_least(key: str, value: int, least: int, why: str = "") -> None:
    if value < least:
        raise ConfigError(key, value, f"an integer >= {least}" + (f" ({why})" if why else ""))


def check_all_reduce_levers(dist: DistConfig | Any) -> None:
    """dist.bucket_cap_mb as every backend takes it; a backend's own limits are its validation
    module's (run again by its context, for library users who skip validate())."""
    if dist.bucket_cap_mb is not None and not dist.bucket_cap_mb > 0:
        raise ConfigError(
            "dist.bucket_cap_mb", dist.bucket_cap_mb, "a size in MB > 0, or null for the framework's default"
        )


def _check_amp(amp: Any) -> None:
    _positive("amp.init_loss_scaling", amp.init_loss_scaling)
    if not amp.incr_ratio > 1:
        raise ConfigError("amp.incr_ratio", amp.incr_ratio, "a number > 1")
    if not 0 < amp.decr_ratio < 1:
        raise ConfigError("amp.decr_ratio", amp.decr_ratio, "a number in (0, 1)")
    _positive("amp.incr_every_n_steps", amp.incr_every_n_steps)
    _positive("amp.decr_every_n_nan_or_inf", amp.decr_every_n_nan_or_inf)


def _check_data(data: Any) -> None:
    _positive("data.image_size", data.image_size)
    _at_least("data.num_classes", data.num_classes, 2, "a classifier needs two classes")
    if data.num_samples is not None:
        _positive("data.num_samples", data.num_samples)
    _at_least("data.num_workers", data.num_workers, 0)
    _one_of("data.augment", data.augment, AUGMENTATIONS)
    if data.name == "imagefolder":
        if not data.path:
            raise ConfigError("data.path", data.path, "a directory of class sub-directories (data=imagefolder)")
        if not os.path.isdir(data.path):
            raise ConfigError("data.path", data.path, "an existing directory of class sub-directories")
    _at_least("data.val_samples", data.val_samples, 0, "0: no held-out set")
    if data.name == "imagefolder" and data.val_path is not None and not os.path.isdir(data.val_path):
        raise ConfigError("data.val_path", data.val_path, "an existing directory of class sub-directories")
    if not (math.isfinite(data.sample_delay_s) and data.sample_delay_s >= 0):
        raise ConfigError("data.sample_delay_s", data.sample_delay_s, "a finite number of seconds >= 0")
    cores = available_cores()
    if data.num_workers > MAX_WORKERS_PER_CORE * cores:
        # Each worker is a process with its own copy of the framework's loader state: beyond a
        # few per core they only take memory and contend.
        raise ConfigError(
            "data.num_workers",
            data.num_workers,
            f"at most {MAX_WORKERS_PER_CORE * cores} ({MAX_WORKERS_PER_CORE} per core of the {cores} here)",
        )


def _check_optim(optim: Any) -> None:
    _positive("optim.lr", optim.lr)
    if not 0 <= optim.momentum < 1:  # also false for nan
        raise ConfigError("optim.momentum", optim.momentum, "a number in [0, 1)")
    if not math.isfinite(optim.weight_decay) or optim.weight_decay < 0:
        raise ConfigError("optim.weight_decay", optim.weight_decay, "a number >= 0")
    _at_least("optim.warmup_steps", optim.warmup_steps, 0)
    _positive("optim.step_size", optim.step_size)
    if not (math.isfinite(optim.gamma) and 0 < optim.gamma <= 1):
        raise ConfigError(
            "optim.gamma", optim.gamma, "a number in (0, 1]: the factor the step schedule multiplies the lr by"
        )
    if not 0 <= optim.label_smoothing < 1:
        raise ConfigError("optim.label_smoothing", optim.label_smoothing, "a number in [0, 1)")
    if optim.clip_grad_norm is not None:
        _positive("optim.clip_grad_norm", optim.clip_grad_norm)
    if optim.nesterov and optim.momentum == 0:
        raise ConfigError("optim.nesterov", True, "false when optim.momentum=0 (Nesterov needs momentum)")


def _check_trainer(trainer: Any) -> None:
    if trainer.steps is not None:
        _positive("trainer.steps", trainer.steps)
    _positive("trainer.epochs", trainer.epochs)
    if not 0 <= trainer.seed < 2**32:
        raise ConfigError(
            "trainer.seed", trainer.seed, "an integer in [0, 2**32): the frameworks' and NumPy's seeds are 32-bit"
        )
    _positive("trainer.batch_size", trainer.batch_size)
    if trainer.threads is not None:
        _positive("trainer.threads", trainer.threads)
        cores = available_cores()
        if trainer.threads > cores:
            # Oversubscribed threads measure contention, not the framework (1000 threads ran
            # ~0.1% of the speed of 2 here).
            raise ConfigError(
                "trainer.threads",
                trainer.threads,
                f"at most {cores}, the cores this process may use (or unset: all of them)",
            )
    _at_least("trainer.eval_every", trainer.eval_every, 0, "0: evaluate only at the end")
    _positive("trainer.eval_batch_size", trainer.eval_batch_size)
    _at_least("trainer.checkpoint_every", trainer.checkpoint_every, 0, "0: no checkpoints")
    _at_least("trainer.keep_checkpoints", trainer.keep_checkpoints, 0, "0: keep every checkpoint")
    _positive("trainer.log_every", trainer.log_every)
    _positive("trainer.accumulate_steps", trainer.accumulate_steps)
    _positive("trainer.repeats", trainer.repeats)


def _check_dist(cfg: Any) -> None:
    dist = cfg.dist
    _positive("dist.nproc_per_node", dist.nproc_per_node)
    _positive("dist.nnodes", dist.nnodes)
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
    _positive("dist.timeout_s", dist.timeout_s)
    _at_least("dist.max_restarts", dist.max_restarts, 0)
    if dist.max_restarts and dist.nnodes > 1:
        raise ConfigError(
            "dist.max_restarts", dist.max_restarts, "0 with dist.nnodes > 1 (restarts are tested on one node only)"
        )
    micro = BatchPlan.micro_batch_of(cfg, dist.nproc_per_node * dist.nnodes)
    if micro < 2 and not cfg.model.freeze_bn:
        raise ConfigError(
            "trainer.batch_size",
            cfg.trainer.batch_size,
            f"at least 2 samples per device and micro-step (this gives {micro}): BatchNorm cannot train on one sample; "
            "or model.freeze_bn=true",
        )


def _check_profiler(profiler: Any) -> None:
    _at_least("profiler.warmup_steps", profiler.warmup_steps, 0)
    if profiler.start < 0:
        raise ConfigError("profiler.start", profiler.start, "a step number >= 0")
    _positive("profiler.steps", profiler.steps)


def _check_classifier(cfg: Any) -> None:
    """A classifier that cannot fit in this machine's memory, said before it is tried (the
    framework's own error would blame the image size or the batch)."""
    free = available_mb()
    if free is None or cfg.model.name not in MODELS:
        return
    features, classes = MODELS.get(cfg.model.name).feature_dim, cfg.data.num_classes
    # Weights, their gradients and momentum, and the batch's logits with their gradients.
    per_class_mb = 4 * (3 * features + 2 * cfg.trainer.batch_size) / 2**20
    if classes * per_class_mb > free:
        raise ConfigError(
            "data.num_classes",
            classes,
            f"at most {int(free / per_class_mb)}: its classifier alone would need "
            f"{classes * per_class_mb / 1024:.1f} GiB, more than the {free / 1024:.1f} GiB free here",
        )


def _check_custom(cfg: Any) -> None:
    """model=custom: the backend's factory names a module that exists (found, not imported: it
    imports its framework), and the mapping file exists."""
    key = f"model.{cfg.backend.name}"
    path = getattr(cfg.model, cfg.backend.name, None)
    allowed = f"an import path pkg.module:function that builds the {cfg.backend.name} model (model=custom)"
    if not path:
        raise ConfigError(key, path, allowed)
    module = path.split(":")[0] if ":" in path else path.rpartition(".")[0]
    try:
        found = bool(module) and importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(key, path, f"{allowed}; no module {module!r} on the path")
    if cfg.model.mapping and not os.path.isfile(cfg.model.mapping):
        raise ConfigError("model.mapping", cfg.model.mapping, "an existing JSON file of {name: name} pairs")


def _check_collective(cfg: Any) -> None:
    """dist.mode=collective: the ResNets on image data."""
    _one_of("model.name", cfg.model.name, MODELS.names() + [CUSTOM] + list(PS_MODELS))
    _check_classifier(cfg)
    if cfg.model.name == CUSTOM:
        _check_custom(cfg)
    spec = MODELS.get(cfg.model.name) if cfg.model.name in MODELS else None
    if isinstance(spec, ViTSpec) and cfg.data.image_size % spec.patch:
        raise ConfigError(
            "data.image_size", cfg.data.image_size, f"a multiple of {cfg.model.name}'s patch size {spec.patch}"
        )
    if cfg.model.name in PS_MODELS:
        raise ConfigError(
            "model",
            cfg.model.name,
            f"one of {', '.join(MODELS.names())} with dist.mode=collective ({cfg.model.name} trains with dist.mode=ps)",
        )
    _one_of("data.name", cfg.data.name, DATASET_NAMES + PS_DATASETS)
    if cfg.data.name in PS_DATASETS:
        raise ConfigError(
            "data",
            cfg.data.name,
            f"one of {', '.join(DATASET_NAMES)} with dist.mode=collective ({cfg.data.name} is for dist.mode=ps)",
        )
    _one_of("optim.name", cfg.optim.name, ("momentum",))


def _check_ps(cfg: Any) -> None:
    """dist.mode=ps: wide&deep on Criteo-format rows, servers and trainers on one node."""
    ps = cfg.dist.ps
    if cfg.model.name not in PS_MODELS:
        raise ConfigError(
            "model",
            cfg.model.name,
            f"{' or '.join(PS_MODELS)} with dist.mode=ps (the ResNets train with dist.mode=collective)",
        )
    if cfg.data.name not in PS_DATASETS:
        raise ConfigError("data", cfg.data.name, f"one of {', '.join(PS_DATASETS)} with dist.mode=ps")
    _one_of("optim.name", cfg.optim.name, PS_OPTIMIZERS)
    if cfg.dist.max_restarts:
        raise ConfigError(
            "dist.max_restarts",
            cfg.dist.max_restarts,
            "0 with dist.mode=ps (a restarted server would come back with empty tables)",
        )
    if cfg.dist.nproc_per_node != 1:
        raise ConfigError(
            "dist.nproc_per_node",
            cfg.dist.nproc_per_node,
            "1 with dist.mode=ps (dist.ps.servers and dist.ps.trainers size the job)",
        )
    _at_least("dist.ps.servers", ps.servers, 0, "0: one process without servers")
    _positive("dist.ps.trainers", ps.trainers)
    if ps.servers == 0 and ps.trainers != 1:
        raise ConfigError(
            "dist.ps.trainers", ps.trainers, "1 with dist.ps.servers=0 (trainers share parameters through servers)"
        )
    _check_ps_nodes(cfg)
    _positive("dist.ps.geo_k_steps", ps.geo_k_steps)
    if cfg.amp.level != "O0":
        raise ConfigError("amp", cfg.amp.level, "O0 with dist.mode=ps (parameter-server jobs train in float32)")
    if cfg.trainer.accumulate_steps != 1:
        raise ConfigError("trainer.accumulate_steps", cfg.trainer.accumulate_steps, "1 with dist.mode=ps")
    _positive("model.sparse_buckets", cfg.model.sparse_buckets)
    _positive("model.embedding_dim", cfg.model.embedding_dim)
    for width in cfg.model.hidden_layers:
        _positive("model.hidden_layers", width)
    if cfg.data.name == "criteo":
        for key, path in (("data.path", cfg.data.path), ("data.val_path", cfg.data.val_path)):
            if (path or key == "data.path") and not (path and os.path.exists(path)):
                raise ConfigError(key, path, f"{criteo_files.ALLOWED}, existing, with data=criteo")
    _check_feed(cfg)


def _check_ps_nodes(cfg: Any) -> None:
    """A parameter-server job over several nodes: where its processes run, every node alike."""
    dist, ps = cfg.dist, cfg.dist.ps
    if dist.nnodes == 1:
        for key in ("node_servers", "node_trainers", "hosts"):
            if len(ps[key]) > 1:
                raise ConfigError(f"dist.ps.{key}", list(ps[key]), "at most one entry with dist.nnodes=1")
        return
    if ps.servers == 0:
        raise ConfigError("dist.ps.servers", 0, "at least 1 with dist.nnodes > 1 (0 trains in one process)")
    for key, total in (("node_servers", ps.servers), ("node_trainers", ps.trainers)):
        counts = list(ps[key])
        if counts and (len(counts) != dist.nnodes or min(counts) < 0 or sum(counts) != total):
            raise ConfigError(
                f"dist.ps.{key}",
                counts,
                f"{dist.nnodes} counts (one per node, node 0's first) that add up to dist.ps.{key[5:]}={total}, "
                "or [] to spread them evenly",
            )
    layout = PsLayout.of(ps, dist.nnodes)
    idle = [node for node in range(dist.nnodes) if layout.processes(node) == 0]
    if idle:
        raise ConfigError(
            "dist.ps.node_servers",
            list(layout.servers),
            f"a layout in which every node runs a server or a trainer (node {idle[0]} would run nothing; "
            f"node_trainers={list(layout.trainers)})",
        )
    if ps.hosts and len(ps.hosts) != dist.nnodes:
        raise ConfigError("dist.ps.hosts", list(ps.hosts), f"{dist.nnodes} addresses, node 0's first, or []")
    for key in ("checkpoint_every", "resume"):
        if cfg.trainer[key]:
            # Each server writes its shard on its own host: a checkpoint would be spread over them.
            raise ConfigError(
                f"trainer.{key}", cfg.trainer[key], "unset with dist.mode=ps over several nodes (dist.nnodes > 1)"
            )


#: What a pass run by the engine cannot have: it runs whole files with no step between.
_PER_STEP = (
    ("trainer.steps", "null"),
    ("trainer.checkpoint_every", "0"),
    ("trainer.eval_every", "0"),
    ("trainer.resume", "null"),
    ("data.num_samples", "null (every row of the files)"),
)


def _check_feed(cfg: Any) -> None:
    """dist.ps.feed=engine: the engine reads each trainer's whole files and steps by itself."""
    ps = cfg.dist.ps
    _positive("dist.ps.threads", ps.threads)
    if ps.feed != "engine":
        if ps.threads != 1:
            raise ConfigError("dist.ps.threads", ps.threads, "1 with dist.ps.feed=steps (threads run engine passes)")
        return
    why = "with dist.ps.feed=engine (the engine runs whole passes over whole files, with no step between)"
    if ps.sync == "sync" and ps.servers:
        raise ConfigError("dist.ps.sync", "sync", f"async or geo {why}: sync trainers meet after every step")
    if cfg.data.name != "criteo" or not cfg.data.val_path:
        raise ConfigError(
            "data.val_path" if cfg.data.name == "criteo" else "data",
            cfg.data.val_path if cfg.data.name == "criteo" else cfg.data.name,
            f"data=criteo with a data.val_path {why}: the held-out rows cannot come from the training files",
        )
    for key, allowed in _PER_STEP:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value not in (None, 0):
            raise ConfigError(key, value, f"{allowed} {why}")
    files = criteo_files.list_files(cfg.data.path)
    if len(files) < ps.trainers:
        raise ConfigError(
            "data.path",
            cfg.data.path,
            f"a folder of at least dist.ps.trainers={ps.trainers} files {why} (it holds {len(files)})",
        )


def processes_per_node(cfg: Any) -> int:
    """The training processes a job starts on this node (parameter servers count)."""
    if cfg.dist.mode != "ps":
        return cfg.dist.nproc_per_node
    return max(1, PsLayout.of(cfg.dist.ps, cfg.dist.nnodes).processes(cfg.dist.node_rank))


def _check_processes(cfg: Any) -> None:
    if cfg.backend.device == "gpu":
        return
    cores, count = available_cores(), processes_per_node(cfg)
    if count > MAX_PROCESSES_PER_CORE * cores:
        key = "dist.ps.trainers" if cfg.dist.mode == "ps" else "dist.nproc_per_node"
        value = cfg.dist.ps.trainers if cfg.dist.mode == "ps" else cfg.dist.nproc_per_node
        raise ConfigError(
            key,
            value,
            f"at most {MAX_PROCESSES_PER_CORE * cores} processes on a CPU of {cores} cores ({count} asked for)",
        )


def validate(cfg: Any) -> None:
    """Refuse values that are well-typed but meaningless (a UnitrainConfig), naming the key and
    what is allowed; then the backend's own refusals."""
    _check_amp(cfg.amp)
    _check_data(cfg.data)
    if cfg.dist.mode == "ps":
        _check_ps(cfg)
    else:
        _check_collective(cfg)
    _check_optim(cfg.optim)
    _check_trainer(cfg.trainer)
    _check_dist(cfg)
    _check_profiler(cfg.profiler)
    _check_processes(cfg)
    validation_module(cfg.backend.name).check(cfg)
