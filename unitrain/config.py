"""The typed config schema: one dataclass per Hydra config group, registered in the ConfigStore.

The YAML files in conf/ choose between these schemas and set values; Hydra checks every
override against them, so a wrong key or type fails at start, before any framework loads.
Value checks that types cannot express live in :func:`validate`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from unitrain.augment import AUGMENTATIONS
from unitrain.errors import ConfigError
from unitrain.malloc import MODES as MALLOC_MODES
from unitrain.models import MODELS
from unitrain.threads import available_cores

AMP_LEVELS = ("O0", "O1", "O2", "O3")
AMP_DTYPES = ("float16", "bfloat16")
AMP_IMPLS = ("native", "apex")
DEVICES = ("auto", "cpu", "gpu")
LR_SCHEDULES = ("constant", "step", "cosine")
LR_SCALINGS = ("linear", "keep_global")
PROFILER_MODES = ("off", "timer", "trace")
SAMPLER_REMAINDERS = ("pad", "drop")
SAMPLER_ORDERS = ("global", "shard")
DATASET_NAMES = ("synthetic", "learnable", "imagefolder", "fashion_mnist")
# dist.mode=ps trains a click-through model on Criteo-format rows (unitrain.ps).
PS_MODELS = ("wide_deep",)
PS_DATASETS = ("criteo", "criteo_synthetic")
# Plain SGD: both engines apply it on the servers (Paddle's dense tables take only SGD or Adam,
# and torch's Adam takes no sparse gradients).
PS_OPTIMIZERS = ("sgd",)
DIST_MODES = ("collective", "ps")
PS_SYNC_MODES = ("sync", "async", "geo")
GRAD_COMPRESSIONS = ("none", "fp16", "bf16")
LOGGERS = ("tensorboard", "visualdl")
NONFINITE_POLICIES = ("stop", "warn")


@dataclass
class BackendConfig:
    name: str = MISSING
    # auto: the accelerator when the framework sees one, else cpu.
    device: str = "auto"
    # true: add the framework's own documented speed settings for the device (unitrain.tuning:
    # torch.compile and channels-last; Paddle's to_static). Rows are labelled "tuned" and
    # never ranked against "same settings" rows.
    tuned: bool = False
    # With tuned=true: which of the framework's settings (torch: compile, channels_last; paddle:
    # to_static); null: the ones that helped on this kind of device when measured (unitrain.tuning).
    tuned_settings: Optional[List[str]] = None


@dataclass
class AmpConfig:
    level: str = "O0"
    dtype: str = "float16"
    impl: str = "native"
    custom_white_list: List[str] = field(default_factory=list)
    custom_black_list: List[str] = field(default_factory=list)
    # Loss scaling knobs, named as in paddle.amp.GradScaler; torch.amp.GradScaler calls them
    # init_scale, growth_factor, backoff_factor, growth_interval (and has no
    # decr_every_n_nan_or_inf: it backs off on every overflow, so it must stay 1 there).
    # use_dynamic_loss_scaling: None is on for float16, off for bfloat16; false turns scaling off.
    use_dynamic_loss_scaling: Optional[bool] = None
    init_loss_scaling: float = 65536.0
    incr_ratio: float = 2.0
    decr_ratio: float = 0.5
    incr_every_n_steps: int = 2000
    decr_every_n_nan_or_inf: int = 1


@dataclass
class ModelConfig:
    name: str = MISSING
    # Where initial weights come from: "framework" draws them with each framework's own RNG,
    # using one init scheme (Kaiming fan-out convs, unit BatchNorm) on both; "shared" draws them
    # once in NumPy from trainer.seed, so every framework starts from the same weights.
    init: str = "framework"
    # Zero the last BatchNorm scale of each residual branch, so every block starts as the identity.
    zero_init_residual: bool = True
    # BatchNorm uses its running statistics and does not update them (its scale and shift still
    # train): the results then do not depend on how a batch is split across devices.
    freeze_bn: bool = False
    # model=wide_deep only: ids are hashed into this many rows of one table shared by the 26
    # slots (a width-1 "wide" table and an embedding_dim "deep" one, both on the servers),
    # and the deep tower's hidden layers.
    sparse_buckets: int = 100_000
    embedding_dim: int = 8
    hidden_layers: List[int] = field(default_factory=lambda: [400, 400, 400])


@dataclass
class DataConfig:
    name: str = MISSING
    image_size: int = 32
    num_classes: int = 10
    # Synthetic sets: None sizes them to exactly trainer.steps batches per epoch (criteo_synthetic:
    # 20,000 rows). criteo: the first num_samples rows of the file train (None: all but the
    # held-out rows), the val_samples rows after them are held out.
    num_samples: Optional[int] = None
    # imagefolder: a directory with one sub-directory of images per class; fashion_mnist: the
    # directory of its four IDX files; criteo: a Criteo TSV file (label, I1..I13, C1..C26).
    path: Optional[str] = None
    num_workers: int = 0
    # Synthetic sets only: seconds of simulated decoding per sample, to study input pipelines.
    sample_delay_s: float = 0.0
    shuffle: bool = True
    drop_last: bool = True
    # How the sampler splits data across replicas (see unitrain.sampler).
    remainder: str = "pad"
    order: str = "global"
    # The held-out set evaluated by trainer.eval_every. imagefolder: a second directory of class
    # sub-directories. Synthetic sets: this many samples from the same distribution, disjoint
    # from the training samples (0: none).
    val_path: Optional[str] = None
    val_samples: int = 0
    # Training-time augmentation, identical on both frameworks: none, standard (random crop
    # with 4 pixels of padding and horizontal flip) or flip (the flip alone); a pure function of
    # seed, epoch and index.
    augment: str = "none"
    # imagefolder only: skip files that cannot be decoded (counted in summary.json) instead of
    # ending the run with one line naming the first such file.
    skip_bad_files: bool = False


@dataclass
class OptimConfig:
    name: str = "momentum"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    schedule: str = "constant"
    warmup_steps: int = 0
    # step schedule: multiply by gamma every step_size steps.
    step_size: int = 30
    gamma: float = 0.1
    # How batch and lr follow the number of devices K (and accumulation steps A):
    # linear: per-device batch kept, global batch = batch_size*K*A, lr scaled by K*A;
    # keep_global: global batch = batch_size, per-device batch = batch_size/(K*A), lr unchanged.
    lr_scaling: str = "linear"
    nesterov: bool = False
    # Cross-entropy against (1 - e) one-hot + e / classes; held-out loss stays plain cross-entropy.
    label_smoothing: float = 0.0
    # Rescale all gradients together when their global L2 norm exceeds this (None: never).
    clip_grad_norm: Optional[float] = None
    # false: no weight decay on BatchNorm parameters and biases (common in ResNet recipes).
    decay_norm_and_bias: bool = True


@dataclass
class TrainerConfig:
    # Batches per epoch (the seed's batch_num), i.e. optimizer steps; with accumulation each
    # batch is accumulate_steps micro-batches. None runs each epoch to the end of the data.
    steps: Optional[int] = 50
    epochs: int = 1
    # Per device (optim.lr_scaling=linear) or for the whole job (optim.lr_scaling=keep_global).
    batch_size: int = 16
    # None: every core this process may use. Applied identically to both frameworks.
    threads: Optional[int] = None
    seed: int = 2024
    log_every: int = 10
    progress: bool = True
    accumulate_steps: int = 1
    # Write every rank's final parameters as NumPy (final_weights.rank<r>.npz) into the run dir.
    save_final_weights: bool = False
    # Run the job this many times (each in a fresh process, into repeat<i>/), for medians and spreads.
    repeats: int = 1
    # Extra metric sinks besides metrics.jsonl: tensorboard (tensorboardX), visualdl.
    loggers: List[str] = field(default_factory=list)
    checkpoint_every: int = 0
    # Evaluate on the held-out set every N steps (0: only at the end); timed apart from training.
    eval_every: int = 0
    # Samples per batch when evaluating (per device).
    eval_batch_size: int = 256
    # Keep the newest N checkpoints of the run (0 keeps all); `latest` always names a kept one.
    keep_checkpoints: int = 3
    resume: Optional[str] = None
    # A non-finite loss outside AMP's skipped steps: stop the run (exit 1) or warn once and go on.
    on_nonfinite: str = "stop"
    # glibc's malloc thresholds: "fixed" keeps freed tensor memory for reuse (a step's cost then
    # does not depend on the process's history: unitrain/malloc.py); "dynamic", glibc's defaults.
    malloc: str = "fixed"


@dataclass
class PsConfig:
    # Processes that hold the parameters; 0 trains in one process without servers (the baseline).
    servers: int = 1
    trainers: int = 2
    # sync (torch only): each step applies all trainers' gradients together; async: each
    # trainer's as they arrive; geo (Paddle only): trainers train their own copy and send the
    # change every geo_k_steps steps.
    sync: str = "async"
    geo_k_steps: int = 100


@dataclass
class DistConfig:
    # collective: every worker holds the model (data parallel); ps: parameter servers hold it
    # and trainers push gradients and pull parameters (model=wide_deep, data=criteo*).
    mode: str = "collective"
    ps: PsConfig = field(default_factory=PsConfig)
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    # None: a free port on this machine (single node only; several nodes must agree on one).
    master_port: Optional[int] = None
    # auto: gloo on CPU, nccl on GPU.
    comm_backend: str = "auto"
    sync_bn: bool = False
    # Seconds the nodes of a multi-node job wait for each other at rendezvous before giving up.
    timeout_s: float = 300.0
    # Gradient all-reduce levers, the frameworks' own. bucket_cap_mb: how many MB of gradients
    # go into one all-reduce (torch DDP's bucket_cap_mb, Paddle's fuse_grad_size_in_MB); None
    # keeps the framework's default (25 MB in both). grad_compression: fp16 sends gradients as
    # float16 and casts them back (torch's fp16_compress_hook); bf16 likewise in bfloat16.
    bucket_cap_mb: Optional[float] = None
    grad_compression: str = "none"


@dataclass
class ProfilerConfig:
    mode: str = "timer"
    # Steps left out of the timing summary (start-up, allocator warm-up).
    warmup_steps: int = 2
    # trace mode: the step window handed to the framework profiler.
    start: int = 10
    steps: int = 5


@dataclass
class UnitrainConfig:
    """The root schema; conf/config.yaml lists it first, then one option per group."""

    backend: BackendConfig = field(default_factory=BackendConfig)
    amp: AmpConfig = field(default_factory=AmpConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)


def register_configs() -> None:
    """Store the root schema; every YAML option in conf/<group>/ is merged onto its typed node."""
    ConfigStore.instance().store(name="unitrain_schema", node=UnitrainConfig)


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
    from unitrain.schedule import BatchPlan  # schedule imports this module

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
