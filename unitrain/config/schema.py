"""The typed config schema: one dataclass per Hydra config group, registered in the ConfigStore.

The YAML files in conf/ choose between these schemas and set values; Hydra checks every
override against them, so a wrong key, a wrong type or a choice outside its Enum
(:mod:`unitrain.config.choices`) fails at start, before any framework loads and before anything
is written. The checks that types cannot express live in :mod:`unitrain.config.validation`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING

from unitrain import tasks
from unitrain.config.choices import (
    AmpDtype,
    AmpImpl,
    AmpLevel,
    Cardinality,
    CommBackend,
    Device,
    DistMode,
    GradCompression,
    Logger,
    LrScaling,
    Malloc,
    ModelInit,
    NonFinite,
    ObjectiveMetric,
    OptimName,
    Order,
    ProfilerMode,
    PsFeed,
    PsSync,
    QuantMethod,
    Remainder,
    Schedule,
    Tokenizer,
)

# The data each kind of job trains on, as its tasks declare them (unitrain/tasks/).
DATASET_NAMES = tasks.datasets("collective")
# dist.mode=ps trains a click-through model on Criteo-format rows (unitrain.ps).
PS_MODELS = ("wide_deep",)
PS_DATASETS = tasks.datasets("ps")


@dataclass
class BackendConfig:
    name: str = MISSING
    # auto: the accelerator when the framework sees one, else cpu.
    device: Device = Device.auto
    # true: add the framework's own documented speed settings for the device (unitrain.interface.speed_settings:
    # torch.compile and channels-last; Paddle's to_static). Rows are labelled "tuned" and
    # never ranked against "same settings" rows.
    tuned: bool = False
    # With tuned=true: which of the framework's settings (torch: compile, channels_last; paddle:
    # to_static); null: the ones that helped on this kind of device when measured (unitrain.interface.speed_settings).
    tuned_settings: Optional[List[str]] = None


@dataclass
class AmpConfig:
    level: AmpLevel = AmpLevel.O0
    dtype: AmpDtype = AmpDtype.float16
    impl: AmpImpl = AmpImpl.native
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
    init: ModelInit = ModelInit.framework
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
    # model=custom only (docs/models.md): each backend's factory by import path
    # (pkg.module:function), called as factory(num_classes=, image_size=, **kwargs); and a JSON file
    # {name: name} pairing the parameters that names, order and shapes cannot.
    paddle: Optional[str] = None
    torch: Optional[str] = None
    kwargs: Any = None  # a mapping: model.kwargs={width:64}
    mapping: Optional[str] = None
    # Language models (gpt_*): the dropout probability of the embeddings, attention and MLP
    # outputs in training (0: none; parity and the conversion check need it off).
    dropout: float = 0.0
    # model=hf only (docs/hugging-face.md): a local Hugging Face model folder (config.json,
    # model.safetensors or its shards, tokenizer.json): LLaMA, Mistral, Qwen2, Qwen3, GPT-2.
    path: Optional[str] = None


@dataclass
class DataConfig:
    name: str = MISSING
    image_size: int = 32
    num_classes: int = 10
    # Synthetic sets: None sizes them to exactly trainer.steps batches per epoch (criteo_synthetic:
    # 20,000 rows). criteo: the first num_samples rows of the file train (None: all but the
    # held-out rows), the val_samples rows after them are held out.
    num_samples: Optional[int] = None
    # criteo_synthetic only: its categorical slots' sizes, small (4 to 2,000 values each: the
    # tables hardly grow) or criteo (Criteo's own, up to 10 million values a slot).
    cardinality: Cardinality = Cardinality.small
    # imagefolder: a directory with one sub-directory of images per class; fashion_mnist: the
    # directory of its four IDX files; criteo: a Criteo TSV file (label, I1..I13, C1..C26).
    path: Optional[str] = None
    num_workers: int = 0
    # Synthetic sets only: seconds of simulated decoding per sample, to study input pipelines.
    sample_delay_s: float = 0.0
    shuffle: bool = True
    drop_last: bool = True
    # How the sampler splits data across replicas (see unitrain.sampler).
    remainder: Remainder = Remainder["pad"]
    order: Order = Order["global"]
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
    # data=text only (docs/text.md): how the corpus becomes tokens, the BPE vocabulary's size,
    # tokens per training sample (None: the model's context length), and the share of the
    # corpus's tokens, at its end, held out.
    tokenizer: Tokenizer = Tokenizer.char
    vocab_size: int = 1024
    block_size: Optional[int] = None
    val_fraction: float = 0.1


@dataclass
class OptimConfig:
    name: OptimName = OptimName.momentum
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    schedule: Schedule = Schedule.constant
    warmup_steps: int = 0
    # step schedule: multiply by gamma every step_size steps.
    step_size: int = 30
    gamma: float = 0.1
    # How batch and lr follow the number of devices K (and accumulation steps A):
    # linear: per-device batch kept, global batch = batch_size*K*A, lr scaled by K*A;
    # keep_global: global batch = batch_size, per-device batch = batch_size/(K*A), lr unchanged.
    lr_scaling: LrScaling = LrScaling.linear
    nesterov: bool = False
    # Cross-entropy against (1 - e) one-hot + e / classes; held-out loss stays plain cross-entropy.
    label_smoothing: float = 0.0
    # Rescale all gradients together when their global L2 norm exceeds this (None: never).
    clip_grad_norm: Optional[float] = None
    # false: no weight decay on normalisation parameters, biases and embeddings (common in
    # ResNet and transformer recipes): only the weights of convolutions and Linears decay.
    decay_norm_and_bias: bool = True
    # adam and adamw: the moments' decay rates and the denominator's epsilon.
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    # cosine schedule: the lr it ends at, as a fraction of the peak (0: down to zero).
    min_lr_ratio: float = 0.0


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
    # Extra metric sinks besides metrics.jsonl: tensorboard (tensorboardX), visualdl, mlflow (the
    # whole run tracked in MLflow: docs/sweeps-and-tracking.md).
    loggers: List[Logger] = field(default_factory=list)
    checkpoint_every: int = 0
    # Evaluate on the held-out set every N steps (0: only at the end); timed apart from training.
    eval_every: int = 0
    # Samples per batch when evaluating (per device).
    eval_batch_size: int = 256
    # Keep the newest N checkpoints of the run (0 keeps all); `latest` always names a kept one.
    keep_checkpoints: int = 3
    resume: Optional[str] = None
    # A non-finite loss outside AMP's skipped steps: stop the run (exit 1) or warn once and go on.
    on_nonfinite: NonFinite = NonFinite.stop
    # glibc's malloc thresholds: "fixed" keeps freed tensor memory for reuse (a step's cost then
    # does not depend on the process's history: unitrain/host/malloc.py); "dynamic", glibc's defaults.
    malloc: Malloc = Malloc.fixed


@dataclass
class PsConfig:
    # Processes that hold the parameters; 0 trains in one process without servers (the baseline).
    servers: int = 1
    trainers: int = 2
    # sync (torch only): each step applies all trainers' gradients together; async: each
    # trainer's as they arrive; geo (Paddle only): trainers train their own copy and send the
    # change every geo_k_steps steps.
    sync: PsSync = PsSync["async"]
    geo_k_steps: int = 100
    # async: how many of a trainer's steps are summed into one update on the servers. 1: every
    # step's gradients are an update of their own, as torch's servers apply each push. null:
    # Fleet's own client merging (Paddle only: up to 13 steps' dense gradients and about 12
    # steps' sparse ones per update; fewer requests, fewer Adam steps: docs/parameter-servers.md).
    merge_pushes: Optional[int] = 1
    # steps: unitrain's loop feeds every step (each mode, both engines). engine: the framework
    # runs whole passes over each trainer's files itself, as its own recommender examples do
    # (Paddle: Fleet's QueueDataset and Executor.train_from_dataset; async and geo, whole files).
    feed: PsFeed = PsFeed.steps
    # Reader and trainer threads of each trainer with feed=engine (at most its files).
    threads: int = 1
    # Several nodes (dist.nnodes > 1): how many of the servers and trainers each node runs,
    # node 0's first, e.g. [2, 0] and [0, 2]; empty: spread evenly. Every node gives the same.
    node_servers: List[int] = field(default_factory=list)
    node_trainers: List[int] = field(default_factory=list)
    # Several nodes: each node's address, node 0's first (Paddle's launcher needs every
    # server's and trainer's address on every node; torch finds them through dist.master_addr).
    hosts: List[str] = field(default_factory=list)


@dataclass
class DistConfig:
    # collective: every worker holds the model (data parallel); ps: parameter servers hold it
    # and trainers push gradients and pull parameters (model=wide_deep, data=criteo*).
    mode: DistMode = DistMode.collective
    ps: PsConfig = field(default_factory=PsConfig)
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    # None: a free port on this machine (single node only; several nodes must agree on one).
    master_port: Optional[int] = None
    # auto: gloo on CPU, nccl on GPU.
    comm_backend: CommBackend = CommBackend.auto
    sync_bn: bool = False
    # Seconds the nodes of a multi-node job wait for each other at rendezvous before giving up.
    timeout_s: float = 300.0
    # The network interface this node's workers talk on (gloo's GLOO_SOCKET_IFNAME, Paddle's
    # node address); None: the one this host reaches dist.master_addr through.
    interface: Optional[str] = None
    # Times the framework's launcher may restart this node's workers after one fails (torchrun's
    # --max-restarts, Paddle's --max_restart with --elastic_level 1); a restarted worker resumes
    # from the run's latest checkpoint (trainer.checkpoint_every), or from the start without one.
    max_restarts: int = 0
    # A directory every node reaches at the same path (a network file system): the job's
    # checkpoints go there (a parameter-server job's every server writes its shard of the tables
    # into it; a restarted worker on any node resumes from it), and every node checks at start
    # that it sees the others' marks. null: the run directory (node 0's).
    shared_dir: Optional[str] = None
    # Gradient all-reduce levers, the frameworks' own. bucket_cap_mb: how many MB of gradients
    # go into one all-reduce (torch DDP's bucket_cap_mb, Paddle's fuse_grad_size_in_MB); None
    # keeps the framework's default (25 MB in both). grad_compression: fp16 sends gradients as
    # float16 and casts them back (torch's fp16_compress_hook); bf16 likewise in bfloat16.
    bucket_cap_mb: Optional[float] = None
    grad_compression: GradCompression = GradCompression.none


@dataclass
class ProfilerConfig:
    mode: ProfilerMode = ProfilerMode.timer
    # Steps left out of the timing summary (start-up, allocator warm-up).
    warmup_steps: int = 2
    # trace mode: the step window handed to the framework profiler.
    start: int = 10
    steps: int = 5


@dataclass
class ObjectiveConfig:
    # What a job returns to a searching sweeper (hydra/sweeper=optuna, docs/sweeps-and-tracking.md):
    # heldout, the last held-out top-1 (AUC for wide&deep), maximized; or time_to_target, the
    # seconds (training and evaluation) until the held-out top-1 first reaches `target`, minimized.
    # A failed, diverged or never-reaching trial returns the worst value, and the search goes on.
    metric: ObjectiveMetric = ObjectiveMetric.heldout
    target: Optional[float] = None


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
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)


# --- the other commands' schemas ---------------------------------------------------------
@dataclass
class ParityConfig:
    # The job's groups again on purpose: a root schema of its own (a shared base would reorder UnitrainConfig's).
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    steps: int = 20
    # Largest relative loss difference (|paddle - torch| / |torch|) over the steps that passes.
    tolerance: float = 1e-3
    # First-batch layer outputs: relative difference (max |a - b| / max |b|) that counts as diverged.
    activation_tolerance: float = 1e-4


@dataclass
class QatConfig:
    # Fine-tuning steps with fake quantization (the job's batch size and data).
    steps: int = 100
    # None: 1% of the job's lr (fine-tuning a trained model), constant after no warm-up.
    lr: Optional[float] = None


@dataclass
class QuantizeConfig:
    # A run directory (its latest checkpoint), a checkpoint directory, or latest.
    source: Optional[str] = None
    # Framework whose toolkit quantizes the native artifact (default: the checkpoint's own): the
    # training app's backend group, so that backend=torch,paddle sweeps as it does there.
    backend: Optional[BackendConfig] = None
    method: QuantMethod = QuantMethod.static
    # Calibration batches (static, and ONNX Runtime's static row for qat); None: 32, or as many
    # as the training set holds.
    calib_batches: Optional[int] = None
    calib_batch_size: int = 32
    per_channel: bool = True
    # 7-bit activations; None: on where the CPU lacks VNNI (saturation of the AVX2 int8 dot product).
    reduce_range: Optional[bool] = None
    # Also quantize the ONNX export with ONNX Runtime (the neutral path).
    onnx: bool = True
    threads: Optional[int] = None
    batches: List[int] = field(default_factory=lambda: [1, 32])
    # Held-out samples for the accuracy column (0: all).
    eval_samples: int = 0
    # Timing: at least min_iters runs and min_time_s seconds per batch size, after warm-up runs.
    min_time_s: float = 2.0
    min_iters: int = 20
    warmup: int = 5
    # Interleaved pairs of runs behind each speed-up (int8 against the same job's fp32 artifact,
    # in the same runtime and process); 0: no speed-ups measured.
    pairs: int = 10
    qat: QatConfig = field(default_factory=QatConfig)


@functools.cache  # once a process: each storing builds the structured configs again (a tenth of a second)
def register_configs() -> None:
    """Store the commands' root schemas; every YAML option in conf/<group>/ is merged onto its typed node."""
    # Imported here: a job's worker processes read this schema and never compose a config, and
    # Hydra's import is a tenth of a second in each of them.
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="unitrain_schema", node=UnitrainConfig)
    store.store(name="parity_schema", node=ParityConfig)
    store.store(name="quantize_schema", node=QuantizeConfig)
