"""Do both frameworks compute the same thing?

Both backends run in this one process, in fp32, from the same initial weights
(``model.init=shared``) on the same batches, with the same threads. Per step it records each
loss, their absolute and relative difference, the largest parameter difference after the step
and the largest relative difference of the BatchNorm running statistics, which training does not
use but evaluation, export and inference do; on the first batch it compares every layer's output
and names the first layer whose output differs by more than ``activation_tolerance``. The
second backend is the reference: relative differences are taken against it, and the states are
compared in the canonical layout (PyTorch's names and layouts).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Tuple

import numpy as np
from omegaconf import OmegaConf

from unitrain.config.schedule import lr_at
from unitrain.config.schema import DATASET_NAMES, ParityConfig, TrainerConfig
from unitrain.config.validation import check_groups, check_image_model, one_of
from unitrain.data.datasets import build_dataset
from unitrain.data.sampler import DistributedBatchSampler
from unitrain.errors import ConfigError
from unitrain.host import machine
from unitrain.host.memory import check_fits
from unitrain.host.threads import available_cores, check_loader_workers, export_threads, resolve_threads
from unitrain.interface.backend import Backend, get_backend
from unitrain.interface.data import data_module
from unitrain.interface.models import models_module
from unitrain.interface.modules import available_backends
from unitrain.interface.optim import optim_module
from unitrain.interface.translate import translate_module
from unitrain.model.build import build_model
from unitrain.model.conversion import pair_tables
from unitrain.model.custom import CustomModel, ProbeSamples, check_factories, model_ref
from unitrain.model.pairing import convert_pair
from unitrain.model.translate import ConversionRefused
from unitrain.model.weights import Arrays, to_canonical
from unitrain.spec.models import CUSTOM, MODELS
from unitrain.spec.optimizers import COLLECTIVE
from unitrain.tasks import task_of
from unitrain.train.layer_outputs import Outputs, activations_pass, first_divergence
from unitrain.train.training_check import check_training, first_random_layer

_RUNNING_STATS = (".running_mean", ".running_var")
#: Steps one parity run compares (the data grows with them).
MAX_STEPS = 1000


def running_stat_diff(state: Arrays, reference: Arrays) -> float:
    """Largest relative difference of BatchNorm running mean or variance (canonical names). A
    mean is set against its channels' spread as well as its own size: a BatchNorm after a linear
    layer of zero-mean channels tracks means of about 1e-9, whose last bits are no difference."""

    def scale(name: str) -> float:
        size = float(np.max(np.abs(reference[name])))
        if name.endswith(".running_mean"):
            var = reference.get(name[: -len(".running_mean")] + ".running_var")
            size = max(size, float(np.sqrt(np.max(var)))) if var is not None else size
        return size + 1e-12

    names = [k for k in reference if k.endswith(_RUNNING_STATS)]
    return max((float(np.max(np.abs(state[k] - reference[k]))) / scale(k) for k in names), default=0.0)


def parameter_diff(state: Arrays, reference: Arrays) -> float:
    """Largest absolute difference of the trained parameters: the state less BatchNorm's buffers."""
    names = [k for k in reference if not k.endswith((*_RUNNING_STATS, ".num_batches_tracked"))]
    return max(float(np.max(np.abs(state[k] - reference[k]))) for k in names)


def _layers_in_both(a: "_Side", b: "_Side") -> Callable[[str], bool]:
    """Whether a layer of that name holds parameters in both halves."""
    owners = [{name.rpartition(".")[0] for name in side.backend.state_arrays(side.model)} for side in (a, b)]
    return lambda layer: all(layer in names for names in owners)


@dataclass(kw_only=True)
class _Side:
    """One framework's half of the comparison."""

    name: str
    backend: Backend
    model: Any
    optimizer: Any
    batches: Iterator
    outputs: Outputs
    # The state as the comparison names it: canonical, or for a user's pair, the reference's names.
    canonical: Callable[[Arrays], Arrays]

    def step(self, capture: bool, label_smoothing: float) -> Tuple[float, Arrays]:
        """One plain fp32 step; the loss and the state after it, canonical."""
        images, labels = next(self.batches)
        if capture:
            with self.backend.capture_outputs(self.model) as self.outputs:
                loss = self.backend.loss(self.model(images), labels, label_smoothing)
        else:
            loss = self.backend.loss(self.model(images), labels, label_smoothing)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return float(self.backend.to_numpy(loss)), self.canonical(self.backend.state_arrays(self.model))


def _side(name: str, cfg: ParityConfig, dataset: Any, threads: int) -> Tuple[_Side, Dict[str, Any]]:
    backend = get_backend(name)
    backend.set_threads(threads)
    backend.seed(cfg.trainer.seed)
    determinism = backend.set_deterministic()
    num_classes = getattr(dataset, "num_classes", cfg.data.num_classes)
    model = build_model(
        backend,
        model_ref(cfg),
        num_classes,
        device="cpu",
        zero_init_residual=cfg.model.zero_init_residual,
        init="shared",
        seed=cfg.trainer.seed,
    )
    seed = cfg.trainer.seed
    sampler = DistributedBatchSampler(
        len(dataset), cfg.trainer.batch_size, shuffle=cfg.data.shuffle, seed=seed, drop_last=True
    )
    if len(sampler) < cfg.steps:
        raise ConfigError("steps", cfg.steps, f"at most {len(sampler)} (batches in the data)")
    model.train()
    batches = iter(data_module(name).make_loader(dataset, sampler))
    side = _Side(
        name=name,
        backend=backend,
        model=model,
        optimizer=optim_module(name).build_optimizer(model, cfg.optim),
        batches=batches,
        outputs=[],
        canonical=lambda state: to_canonical(name, state),
    )
    return side, determinism


def validate(cfg: ParityConfig) -> None:
    """What parity cannot run, or could only report falsely: refused before anything runs."""
    if not 0 < cfg.steps <= MAX_STEPS:
        raise ConfigError("steps", cfg.steps, f"an integer from 1 to {MAX_STEPS} (steps compared one by one)")
    for key, value in (("tolerance", cfg.tolerance), ("activation_tolerance", cfg.activation_tolerance)):
        if not (math.isfinite(value) and 0 < value <= 1):
            # Above 1 a relative difference passes whatever the two computed: a check that cannot fail.
            raise ConfigError(key, value, "a number in (0, 1] (the largest relative difference that passes)")
    check_groups(cfg)
    one_of("data.name", cfg.data.name, DATASET_NAMES)
    one_of("optim.name", cfg.optim.name, COLLECTIVE)
    _only_what_parity_reads(cfg)
    spec = MODELS.get(cfg.model.name) if cfg.model.name in MODELS else None
    features = spec.feature_dim if spec is not None else None
    check_fits(cfg.data.image_size, cfg.trainer.batch_size, cfg.data.num_classes, features)
    check_loader_workers(cfg.data.num_workers)
    if cfg.trainer.batch_size < 2:
        raise ConfigError("trainer.batch_size", cfg.trainer.batch_size, "at least 2 (BatchNorm trains on the batch)")
    one_of("model.name", cfg.model.name, MODELS.names() + [CUSTOM])
    check_image_model(cfg.model.name, cfg.data.image_size, cfg.model.freeze_bn)
    check_factories(cfg.model)
    threads, cores = cfg.trainer.threads, available_cores()
    if threads is not None and not 1 <= threads <= cores:
        raise ConfigError(
            "trainer.threads", threads, f"1 to {cores}, the cores this process may use (or unset: all of them)"
        )


#: The trainer keys parity reads; the others would change nothing there.
_TRAINER_READ = ("seed", "batch_size", "threads")


def _only_what_parity_reads(cfg: ParityConfig) -> None:
    """A trainer setting parity does not read is refused, not silently ignored."""
    for f in dataclasses.fields(TrainerConfig):
        if f.name in _TRAINER_READ:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        value = cfg.trainer[f.name]
        if value != default and not (isinstance(default, list) and list(value) == default):
            raise ConfigError(
                f"trainer.{f.name}",
                value,
                f"its default ({default}) with unitrain.parity, which reads trainer.{', trainer.'.join(_TRAINER_READ)} "
                "only",
            )


def _pair(a: _Side, b: _Side, explicit: Dict[str, str]) -> None:
    """A user's pair: ``a`` starts from ``b``'s initial weights, and its states are compared in
    ``b``'s names, both matched parameter by parameter (unitrain.model.pairing)."""
    b_state = b.backend.state_arrays(b.model)
    b_linear = models_module(b.name).linear_weights(b.model)
    source, target, counters = pair_tables(b.name, b_state, b_linear, a.backend, a.model)
    a.backend.load_state_arrays(a.model, convert_pair(b_state, source, target, explicit, counters))
    a_state = a.backend.state_arrays(a.model)
    back_source, back_target, back_counters = pair_tables(
        a.name, a_state, models_module(a.name).linear_weights(a.model), b.backend, b.model
    )
    a.canonical = lambda state: convert_pair(state, back_source, back_target, explicit, back_counters)
    b.canonical = dict


def _compared_step(cfg: ParityConfig, a: "_Side", b: "_Side", step: int) -> Dict[str, Any]:
    """One optimizer step of both sides from where they are, and how far apart they end."""
    # The job's warm-up and schedule over the compared steps, as the Trainer sets them.
    for side in (a, b):
        optim_module(side.name).set_lr(side.optimizer, lr_at(step, cfg.steps, cfg.optim))
    (loss_a, state_a), (loss_b, state_b) = (side.step(step == 0, cfg.optim.label_smoothing) for side in (a, b))
    abs_diff = abs(loss_a - loss_b)
    return {
        "step": step + 1,
        f"loss_{a.name}": loss_a,
        f"loss_{b.name}": loss_b,
        "abs_diff": abs_diff,
        "rel_diff": abs_diff / max(abs(loss_b), 1e-12),
        "max_param_diff": parameter_diff(state_a, state_b),
        "running_stat_rel_diff": running_stat_diff(state_a, state_b),
    }


def run_parity(cfg: ParityConfig, out_dir: Path) -> Dict[str, Any]:
    validate(cfg)
    threads = resolve_threads(cfg.trainer.threads)
    export_threads(threads)
    # The task's training samples (a corpus's windows: its tokenizer kept in the run directory).
    dataset = task_of(cfg).data(cfg, out_dir, None, cfg.steps * cfg.trainer.batch_size).train
    (a, determinism_a), (b, determinism_b) = (_side(name, cfg, dataset, threads) for name in available_backends())
    if isinstance(model_ref(cfg), CustomModel):
        _pair(a, b, model_ref(cfg).explicit_mapping())
    records = [_compared_step(cfg, a, b, step) for step in range(cfg.steps)]
    worst = max(r["rel_diff"] for r in records)
    worst_stats = max(r["running_stat_rel_diff"] for r in records)
    activations = first_divergence(a.outputs, b.outputs, cfg.activation_tolerance, _layers_in_both(a, b))
    report = {
        "frameworks": [a.name, b.name],
        "model": cfg.model.name,
        "data": cfg.data.name,
        "steps": cfg.steps,
        "batch_size": cfg.trainer.batch_size,
        "lr": cfg.optim.lr,
        "optimizer": str(cfg.optim.name),
        "threads": threads,
        # The kernels an instruction set selects sum in other orders: the differences below move
        # with the CPU (docs/parity.md).
        "cpu": machine.cpu(),
        "kernel_env": machine.kernel_env(),
        "versions": {side.name: side.backend.version() for side in (a, b)},
        "determinism": {a.name: determinism_a, b.name: determinism_b},
        "tolerance": cfg.tolerance,
        "max_rel_loss_diff": worst,
        "max_running_stat_rel_diff": worst_stats,
        "passed": worst <= cfg.tolerance and worst_stats <= cfg.tolerance and activations_pass(activations),
        "first_batch_activations": activations | {"tolerance": cfg.activation_tolerance},
        "per_step": records,
        "random_layer": None,
    }
    # A model that draws random numbers in training cannot agree step by step: named, not guessed.
    if not report["passed"]:
        report["random_layer"] = first_random_layer(b, dataset, cfg.trainer.batch_size, cfg.trainer.seed)
    (out_dir / "parity.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


#: Layer outputs of a translated half and its source, from the same weights, that pass.
CONVERTED_TOLERANCE = 1e-4


def _evaluate(side: _Side) -> float:
    images, labels = next(side.batches)
    side.model.eval()
    with side.backend.capture_outputs(side.model) as side.outputs:
        loss = side.backend.loss(side.model(images), labels)
    return float(side.backend.to_numpy(loss))


def check_converted(cfg: Any, backend: str, num_classes: int | None = None) -> Dict[str, Any]:
    """``model.<backend>=convert``: the translated half and the half it came from, given the
    same weights, compute the same outputs on one batch in evaluation mode, layer by layer; otherwise the job stops
    in one line naming the first layer that differs. Returns the comparison. The batch is images,
    or with data=text int64 token ids [2, data.block_size] in [0, ``num_classes``) (the vocabulary)."""
    probe = task_of(cfg).conversion_check(cfg.data, num_classes)
    check = OmegaConf.merge(
        OmegaConf.structured(ParityConfig),
        {
            "model": OmegaConf.to_container(cfg.model, resolve=True),
            "data": probe.data,
            "trainer": {"batch_size": probe.batch_size, "seed": cfg.trainer.seed},
            "steps": 1,
        },
    )
    # Two batches: one for the forward compared in evaluation mode, one for the training step.
    pair = model_ref(check)
    if pair.text:  # token ids the pair's factories take, not a dataset's
        dataset = ProbeSamples(pair, check.data.num_classes, count=4, seed=check.trainer.seed)
    else:
        dataset = build_dataset(check.data, default_size=2 * probe.batch_size, seed=check.trainer.seed)
    threads = resolve_threads(cfg.trainer.threads)
    converted, _ = _side(backend, check, dataset, threads)
    source_name = translate_module(backend).SOURCE
    source, _ = _side(source_name, check, dataset, threads)
    _pair(converted, source, model_ref(check).explicit_mapping())
    # In evaluation mode: what dropout draws differs between the frameworks' generators.
    losses = [_evaluate(side) for side in (converted, source)]
    found = first_divergence(converted.outputs, source.outputs, CONVERTED_TOLERANCE, _layers_in_both(converted, source))
    loss_diff = abs(losses[0] - losses[1]) / max(abs(losses[1]), 1e-12)
    where = f"model.{backend}=convert: from the same weights, on one batch,"
    if found["first_beyond_tolerance"]:
        first = found["first_beyond_tolerance"]
        raise ConversionRefused(
            f"{where} the converted half's {first['layer']} differs from the {source_name} half's by "
            f"{first['rel_diff']:.2e} (relative; at most {CONVERTED_TOLERANCE:g} passes); allowed: a model whose "
            f"conversion computes the same (see docs/models.md), or a {backend} half of your own"
        )
    if not activations_pass(found) or loss_diff > CONVERTED_TOLERANCE:
        raise ConversionRefused(
            f"{where} the halves' losses differ by {loss_diff:.2e} (relative) and {found['layers_unpaired']} layer "
            f"output(s) have no counterpart (first: {found['first_unpaired']}); allowed: a model whose conversion "
            f"computes the same (see docs/models.md), or a {backend} half of your own"
        )
    batch = check.trainer.batch_size
    written = (f"model.{source_name}", getattr(cfg.model, source_name))
    training = check_training(
        converted, source, dataset, batch, check.trainer.seed, f"model.{backend}=convert:", written
    )
    return found | {"loss_rel_diff": loss_diff, "training": training}
