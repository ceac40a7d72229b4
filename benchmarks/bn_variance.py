"""What BatchNorm's running-variance definition changes in held-out accuracy, and what following
torch's costs Paddle.

Paddle's own BatchNorm folds the biased batch variance into its running variance (divided by n,
the values a channel has in a training batch: batch x height x width of the layer's input),
torch's the unbiased one (n - 1); unitrain's Paddle models follow torch since 2026-11-24.
``accuracy`` evaluates each checkpoint of a run twice in torch on the run's held-out set, with
the running variance under each definition: the recorded one, and the other obtained by scaling
each layer's by n / (n - 1) or its inverse, which is exact up to rounding once the initial
value's weight in the running average (0.9 ** steps) is gone. ``--recorded biased`` for Paddle
runs made before that change. Writes results.json and results.md.

And what unitrain's correction costs a Paddle training step: its models against the same models
with Paddle's own BatchNorm2D, alternating step by step in one process (same weights, same
batch, same hand-written step), wall and CPU time. Writes cost.json and cost.md.

    python benchmarks/bn_variance.py accuracy <run dir> [--recorded biased|unbiased] [--out DIR]
    python benchmarks/bn_variance.py cost [--steps 30] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

import unitrain
from unitrain.data.datasets import build_heldout_dataset
from unitrain.host.machine import cpu
from unitrain.model.weights import convert
from unitrain.report.intervals import median_ci
from unitrain.train.evaluation import Evaluator


def values_per_channel(model, batch: int, image_size: int) -> dict[str, int]:
    """n for each BatchNorm layer: batch x the height x width of what it normalises."""
    sizes, hooks = {}, []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            hooks.append(
                module.register_forward_hook(
                    lambda m, args, out, name=name: sizes.__setitem__(name, batch * out.shape[2] * out.shape[3])
                )
            )
    with torch.no_grad():
        model.eval()(torch.zeros(1, 3, image_size, image_size))
    for hook in hooks:
        hook.remove()
    return sizes


def evaluate(model, dataset, batch_size: int = 500) -> dict[str, float]:
    """unitrain's own held-out evaluation, in torch, in one process."""
    T = unitrain.get_backend("torch")
    with T.distributed(None, "cpu") as dist:
        return Evaluator(T, dataset, dist, batch_size)(model, T.precision())


def accuracy(args) -> None:
    torch.set_num_threads(1)  # beside a running job, take one core
    T = unitrain.get_backend("torch")
    rows = []
    for ckpt in sorted((args.run / "checkpoints").glob("step*"), key=lambda p: int(p.name[4:])):
        meta = json.loads((ckpt / "meta.json").read_text())
        cfg = OmegaConf.create(meta["config"])
        dataset = build_heldout_dataset(cfg.data, cfg.trainer.seed)
        with np.load(ckpt / "model.npz") as npz:
            arrays = convert(dict(npz), meta["framework"], "torch")
        model = unitrain.build_model(T, cfg.model.name, dataset.num_classes)
        n = values_per_channel(model, cfg.trainer.batch_size, cfg.data.image_size)
        row = {
            "step": meta["step"],
            "framework": meta["framework"],
            "recorded": args.recorded,
            "smallest_n": min(n.values()),
        }
        for variant in ("biased", "unbiased"):
            state = dict(arrays)
            if variant != args.recorded:
                for name, count in n.items():
                    factor = count / (count - 1) if variant == "unbiased" else (count - 1) / count
                    state[f"{name}.running_var"] = state[f"{name}.running_var"] * factor
            T.load_state_arrays(model, state)
            row[variant] = evaluate(model, dataset)
        row["top1_difference"] = row["unbiased"]["val_top1"] - row["biased"]["val_top1"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    if not rows:
        raise SystemExit(
            f"bn_variance: no checkpoints under {args.run / 'checkpoints'}; train with trainer.checkpoint_every"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"run": str(args.run), "machine": cpu(), "rows": rows}
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "| step | smallest n | top-1, biased (Paddle's own) | top-1, unbiased (torch's) | difference | loss, biased | "
        "loss, unbiased |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['step']} | {r['smallest_n']} | {r['biased']['val_top1']:.4f} | {r['unbiased']['val_top1']:.4f} | "
            f"{r['top1_difference']:+.4f} "
            f"| {r['biased']['val_loss']:.4f} | {r['unbiased']['val_loss']:.4f} |"
        )
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _cost_models(P, name: str) -> dict:
    """The same model twice, from the same seed: unitrain's BatchNorm and Paddle's own."""
    import paddle

    models = {
        "unitrain": unitrain.build_model(P, name, 10, init="shared", seed=0),
        "paddle's own": unitrain.build_model(P, name, 10, init="shared", seed=0),
    }
    for layer in models["paddle's own"].sublayers():
        if isinstance(layer, paddle.nn.BatchNorm2D):
            layer.__class__ = paddle.nn.BatchNorm2D  # the same layer, Paddle's own forward
    return models


def _time_alternating(P, models: dict, optimizers: dict, images, labels, steps: int) -> dict[str, list]:
    """(wall, CPU) seconds of each step per model; the order flips every step so neither always goes first."""
    times = {k: [] for k in models}
    for i in range(steps + 2):
        for kind in list(models) if i % 2 == 0 else list(models)[::-1]:
            wall, cpu_s = time.perf_counter(), time.process_time()
            loss = P.loss(models[kind](images), labels)
            loss.backward()
            optimizers[kind].step()
            optimizers[kind].clear_grad()
            float(loss)
            if i >= 2:
                times[kind].append((time.perf_counter() - wall, time.process_time() - cpu_s))
    return times


def _cost_row(P, name: str, size: int, batch: int, steps: int) -> dict:
    import paddle

    models = _cost_models(P, name)
    optimizers = {k: paddle.optimizer.Momentum(0.01, parameters=m.parameters()) for k, m in models.items()}
    rng = np.random.default_rng(0)
    images = paddle.to_tensor(rng.standard_normal((batch, 3, size, size)).astype(np.float32))
    labels = paddle.to_tensor(rng.integers(0, 10, batch))
    times = _time_alternating(P, models, optimizers, images, labels, steps)
    ratios = {
        m: [a[j] / b[j] for a, b in zip(times["unitrain"], times["paddle's own"])]
        for j, m in enumerate(("wall", "cpu"))
    }
    return {
        "model": f"{name} {size}x{size} batch {batch}",
        "steps": steps,
        "unitrain_ms": 1e3 * float(np.median([t[0] for t in times["unitrain"]])),
        "paddle_own_ms": 1e3 * float(np.median([t[0] for t in times["paddle's own"]])),
        "wall_ratio": median_ci(ratios["wall"]),
        "cpu_ratio": median_ci(ratios["cpu"]),
    }


def _write_cost(args, rows: list[dict]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cost.json").write_text(
        json.dumps({"machine": cpu(), "threads": args.threads, "rows": rows}, indent=2) + "\n"
    )
    lines = [
        "| model | unitrain ms/step | Paddle's own BN ms/step | wall ratio [95% CI] | CPU ratio [95% CI] | pairs |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        w, c = r["wall_ratio"], r["cpu_ratio"]
        lines.append(
            f"| {r['model']} | {r['unitrain_ms']:.1f} | {r['paddle_own_ms']:.1f} | {w[0]:.3f} [{w[1]:.3f}, "
            f"{w[2]:.3f}] | {c[0]:.3f} [{c[1]:.3f}, {c[2]:.3f}] | {r['steps']} |"
        )
    (args.out / "cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def cost(args) -> None:
    P = unitrain.get_backend("paddle")
    P.set_threads(args.threads)
    rows = []
    sizes = (("tiny", 16, 8),) if args.quick else (("resnet18", 32, 128), ("resnet50", 64, 16))
    for name, size, batch in sizes:
        row = _cost_row(P, name, size, batch, args.steps)
        print(json.dumps(row), flush=True)
        rows.append(row)
    _write_cost(args, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    acc = commands.add_parser("accuracy", help="evaluate a Paddle run's checkpoints with both running variances")
    acc.add_argument("run", type=Path, help="a run directory with checkpoints/step<N>/")
    acc.add_argument(
        "--recorded",
        choices=("biased", "unbiased"),
        default="unbiased",
        help="the definition the run's checkpoints hold: biased for Paddle runs before 2026-11-24",
    )
    price = commands.add_parser("cost", help="time a Paddle training step with and without the correction")
    price.add_argument("--steps", type=int, default=30, help="steps of each kind, after 2 of each as warm-up")
    price.add_argument("--threads", type=int, default=2)
    price.add_argument("--quick", action="store_true", help="the tiny model at 16x16, batch 8 (a check that it runs)")
    for sub in (acc, price):
        sub.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "bn_variance")
    args = parser.parse_args()
    accuracy(args) if args.command == "accuracy" else cost(args)


if __name__ == "__main__":
    main()
