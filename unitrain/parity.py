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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List

import hydra
import numpy as np
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from unitrain import machine
from unitrain.backend import get_backend
from unitrain.config import DataConfig, ModelConfig, OptimConfig, TrainerConfig, register_configs
from unitrain.state import to_canonical
from unitrain.data import build_dataset
from unitrain.errors import ConfigError, UnitrainError
from unitrain.sampler import DistributedBatchSampler
from unitrain.threads import export_threads, resolve_threads

log = logging.getLogger("unitrain")
FRAMEWORKS = ("paddle", "torch")


@dataclass
class ParityConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    steps: int = 20
    # Largest relative loss difference (|paddle - torch| / |torch|) over the steps that passes.
    tolerance: float = 1e-3
    # First-batch layer outputs: relative difference (max |a - b| / max |b|) that counts as diverged.
    activation_tolerance: float = 1e-4


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


def plot(records: List[Dict[str, float]], tolerance: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    fig, (ax_loss, ax_diff) = plt.subplots(1, 2, figsize=(11, 4))
    ax_loss.plot(steps, [r["loss_paddle"] for r in records], label="paddle")
    ax_loss.plot(steps, [r["loss_torch"] for r in records], "--", label="torch")
    ax_loss.set(title="loss, same weights and batches", xlabel="step", ylabel="loss")
    ax_loss.legend()
    floor = 1e-12  # a log axis cannot show an exact zero
    ax_diff.semilogy(steps, [max(r["rel_diff"], floor) for r in records], label="relative loss difference")
    ax_diff.semilogy(steps, [max(r["max_param_diff"], floor) for r in records], label="max parameter difference")
    ax_diff.semilogy(steps, [max(r["running_stat_rel_diff"], floor) for r in records], label="BatchNorm running statistics (relative)")
    ax_diff.axhline(tolerance, color="red", linestyle=":", label=f"tolerance {tolerance:g}")
    ax_diff.set(title="divergence between frameworks", xlabel="step")
    ax_diff.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(report: Dict[str, Any]) -> str:
    lines = ["| step | loss paddle | loss torch | abs diff | rel diff | max param diff | BN stats rel diff |", "|---|---|---|---|---|---|---|"]
    for r in report["per_step"]:
        lines.append(
            f"| {r['step']} | {r['loss_paddle']:.6f} | {r['loss_torch']:.6f} | {r['abs_diff']:.2e} | {r['rel_diff']:.2e} | {r['max_param_diff']:.2e} | {r['running_stat_rel_diff']:.2e} |"
        )
    a = report["first_batch_activations"]
    first = a["first_beyond_tolerance"]
    lines.append(
        f"\nfirst batch, {a['layers_compared']} layer outputs compared: "
        + (f"first beyond {a['tolerance']:g} is {first['layer']} ({first['rel_diff']:.2e})" if first else f"all within {a['tolerance']:g}")
        + f"; largest {a['largest']['layer']} ({a['largest']['rel_diff']:.2e})"
    )
    lines.append(f"CPU: {machine.describe_cpu(report['cpu'], report['kernel_env'])}")
    verdict = "within" if report["passed"] else "BEYOND"
    lines.append(
        f"max relative loss difference {report['max_rel_loss_diff']:.2e}, BatchNorm running statistics "
        f"{report['max_running_stat_rel_diff']:.2e}: {verdict} tolerance {report['tolerance']:g}"
    )
    return "\n".join(lines)


register_configs()
ConfigStore.instance().store(name="parity_schema", node=ParityConfig)


@hydra.main(version_base=None, config_path="pkg://unitrain.conf", config_name="parity")
def _main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        report = run_parity(cfg, out_dir)
    except UnitrainError as err:
        print(f"unitrain.parity: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    print(format_table(report) + f"\n\nwritten: {out_dir / 'parity.json'}, {out_dir / 'parity.png'}", flush=True)
    if not report["passed"]:
        sys.exit(1)


def main() -> None:
    from unitrain.app import hydra_entry

    hydra_entry("unitrain.parity", _main, config_name="parity")


if __name__ == "__main__":
    main()
