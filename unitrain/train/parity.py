"""Do both frameworks compute the same thing? ``python -m unitrain.parity model=resnet18 steps=20``

Both backends run in this one process, in fp32, from the same initial weights
(``model.init=shared``) on the same batches, with the same threads. Per step it reports each
loss, their absolute and relative difference and the largest parameter difference after the
step and the largest relative difference of the BatchNorm running statistics, which training
does not use but evaluation, export and inference do; on the first batch it compares every
layer's output and names the first layer whose output differs by more than
``activation_tolerance``. Writes parity.json and parity.png into the run directory and exits 1
when the relative loss difference or that of the running statistics exceeds ``tolerance``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

from unitrain.host import machine
from unitrain.interface.backend import get_backend
from unitrain.config.schema import ParityConfig
from unitrain.report.parity import plot
from unitrain.model.weights import to_canonical
from unitrain.data.datasets import build_dataset
from unitrain.errors import ConfigError
from unitrain.data.sampler import DistributedBatchSampler
from unitrain.host.threads import export_threads, resolve_threads

log = logging.getLogger("unitrain")
FRAMEWORKS = ("paddle", "torch")




def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12))


_RUNNING_STATS = (".running_mean", ".running_var")


def running_stat_diff(paddle_state: Dict[str, np.ndarray], torch_state: Dict[str, np.ndarray]) -> float:
    """Largest relative difference of BatchNorm running mean or variance (canonical names)."""
    names = [k for k in torch_state if k.endswith(_RUNNING_STATS)]
    return max((_rel(paddle_state[k], torch_state[k]) for k in names), default=0.0)


def parameter_diff(paddle_state: Dict[str, np.ndarray], torch_state: Dict[str, np.ndarray]) -> float:
    """Largest absolute difference of the trained parameters: the state less BatchNorm's buffers."""
    names = [k for k in torch_state if not k.endswith((*_RUNNING_STATS, ".num_batches_tracked"))]
    return max(float(np.max(np.abs(paddle_state[k] - torch_state[k]))) for k in names)


def first_divergence(acts: Dict[str, List], tolerance: float) -> Dict[str, Any]:
    """Compare layer outputs in execution order; the first beyond ``tolerance``, and the worst."""

    def numbered(outputs):
        # A layer object can run several times per forward (a block's one ReLU runs twice):
        # pair its n-th call on one framework with its n-th call on the other.
        seen: Dict[str, int] = {}
        for name, out in outputs:
            seen[name] = seen.get(name, 0) + 1
            yield (f"{name}#{seen[name]}" if seen[name] > 1 else name), out

    torch_acts = dict(numbered(acts["torch"]))
    compared, first, worst = 0, None, {"layer": None, "rel_diff": 0.0}
    for name, out in numbered(acts["paddle"]):
        if name not in torch_acts or torch_acts[name].shape != out.shape:
            continue
        rel = _rel(out, torch_acts[name])
        compared += 1
        if rel > worst["rel_diff"]:
            worst = {"layer": name, "rel_diff": rel}
        if first is None and rel > tolerance:
            first = {"layer": name, "rel_diff": rel}
    return {"layers_compared": compared, "first_beyond_tolerance": first, "largest": worst}


def run_parity(cfg: ParityConfig, out_dir: Path) -> Dict[str, Any]:
    if cfg.steps <= 0:
        raise ConfigError("steps", cfg.steps, "a number > 0")
    threads = resolve_threads(cfg.trainer.threads)
    export_threads(threads)
    backends = {name: get_backend(name) for name in FRAMEWORKS}
    dataset = build_dataset(cfg.data, default_size=cfg.steps * cfg.trainer.batch_size, seed=cfg.trainer.seed)
    num_classes = getattr(dataset, "num_classes", cfg.data.num_classes)
    runs: Dict[str, Dict[str, Any]] = {}
    determinism = {}
    for name, backend in backends.items():
        backend.set_threads(threads)
        backend.seed(cfg.trainer.seed)
        determinism[name] = backend.set_deterministic()
        model = backend.build_model(cfg.model.name, num_classes, "cpu", cfg.model.zero_init_residual, "shared", cfg.trainer.seed)
        sampler = DistributedBatchSampler(len(dataset), cfg.trainer.batch_size, shuffle=cfg.data.shuffle, seed=cfg.trainer.seed, drop_last=True)
        if len(sampler) < cfg.steps:
            raise ConfigError("steps", cfg.steps, f"at most {len(sampler)} (batches in the data)")
        model.train()
        runs[name] = {"model": model, "optimizer": backend.build_optimizer(model, cfg.optim), "batches": iter(backend.make_loader(dataset, sampler))}

    records, acts = [], {}
    for step in range(cfg.steps):
        losses, states = {}, {}
        for name, backend in backends.items():
            r = runs[name]
            images, labels = next(r["batches"])
            if step == 0:
                with backend.capture_outputs(r["model"]) as acts[name]:
                    loss = backend.loss(r["model"](images), labels, cfg.optim.label_smoothing)
            else:
                loss = backend.loss(r["model"](images), labels, cfg.optim.label_smoothing)
            loss.backward()
            r["optimizer"].step()
            r["optimizer"].zero_grad()
            losses[name] = float(backend.to_numpy(loss))
            states[name] = to_canonical(name, backend.state_arrays(r["model"]))
        param_diff = parameter_diff(states["paddle"], states["torch"])
        abs_diff = abs(losses["paddle"] - losses["torch"])
        records.append({
            "step": step + 1, "loss_paddle": losses["paddle"], "loss_torch": losses["torch"], "abs_diff": abs_diff,
            "rel_diff": abs_diff / max(abs(losses["torch"]), 1e-12), "max_param_diff": param_diff,
            "running_stat_rel_diff": running_stat_diff(states["paddle"], states["torch"]),
        })  # fmt: skip
    worst = max(r["rel_diff"] for r in records)
    worst_stats = max(r["running_stat_rel_diff"] for r in records)
    report = {
        "model": cfg.model.name,
        "data": cfg.data.name,
        "steps": cfg.steps,
        "batch_size": cfg.trainer.batch_size,
        "lr": cfg.optim.lr,
        "threads": threads,
        # The kernels an instruction set selects sum in other orders: the differences below move
        # with the CPU (README: 1.3e-5 to 3.8e-5 on one machine, by kernel path alone).
        "cpu": machine.cpu(),
        "kernel_env": machine.kernel_env(),
        "versions": {name: b.version() for name, b in backends.items()},
        "determinism": determinism,
        "tolerance": cfg.tolerance,
        "max_rel_loss_diff": worst,
        "max_running_stat_rel_diff": worst_stats,
        "passed": worst <= cfg.tolerance and worst_stats <= cfg.tolerance,
        "first_batch_activations": first_divergence(acts, cfg.activation_tolerance) | {"tolerance": cfg.activation_tolerance},
        "per_step": records,
    }
    (out_dir / "parity.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(records, cfg.tolerance, out_dir / "parity.png")
    return report












