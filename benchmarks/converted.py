"""A model converted from PyTorch (``model.paddle=convert``) against unitrain's own Paddle model of
the same shape: what conversion costs a training step.

    python benchmarks/converted.py --model resnet18 --image-size 32 --pairs 30 --out converted.json

Both models are built in one process: unitrain's hand-written Paddle ResNet18 (or ``vit_small``)
and the Paddle half PaConvert writes from ``examples/gallery/resnet18.py`` (or ``vit.py`` at the
same dimensions), checked to have the same parameter count. Each pair of measurements is one
training step of each (forward, cross-entropy, backward, momentum SGD, clear the gradients) on
the same batch, in an order that alternates; the ratio converted / hand-written of each pair
gives the median and its 95% interval. Weights are drawn by each model (a step's time does not
depend on their values). ``--profile`` adds each model's top operators by self time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: (built-in model, gallery factory, its keyword arguments) of the same shape.
SHAPES = {
    "resnet18": ("resnet18", "gallery.resnet18:build", {"width": 64}),
    "vit": ("vit_small", "gallery.vit:build", {"dim": 192, "depth": 6, "heads": 3, "mlp_ratio": 4.0}),
}


def _parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SHAPES), required=True)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=30, help="pairs of steps, after 3 of each as warm-up")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def _models(args):
    import unitrain
    from unitrain.interface.backend import get_backend
    from unitrain.model.custom import CustomModel, sized

    backend = get_backend("paddle")
    backend.set_threads(args.threads)
    builtin, factory, kwargs = SHAPES[args.model]
    own = unitrain.build_model(backend, sized(builtin, args.image_size), 10, image_size=args.image_size)
    pair = CustomModel(factories={"torch": factory, "paddle": "convert"}, kwargs=kwargs, image_size=args.image_size)
    converted = pair.build("paddle", 10)
    counts = [backend.num_parameters(m) for m in (converted, own)]
    if counts[0] != counts[1]:
        sys.exit(f"not the same shape: {counts[0]} parameters converted, {counts[1]} hand-written")
    return backend, {"converted": converted, "hand-written": own}, counts[0]


def _stepper(model, images, labels):
    import paddle

    optimizer = paddle.optimizer.Momentum(learning_rate=0.01, momentum=0.9, parameters=model.parameters())

    def step() -> float:
        started = time.perf_counter()
        loss = paddle.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        float(loss)  # waits for the step, as a loop reading its loss does
        return time.perf_counter() - started

    return step


def main(argv=None) -> int:
    args = _parse_args(argv)
    sys.path.insert(0, str(ROOT / "examples"))
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import numpy as np
    import paddle

    from unitrain.host.machine import cpu
    from unitrain.report.intervals import median_ci

    backend, models, parameters = _models(args)
    rng = np.random.default_rng(0)
    images = paddle.to_tensor(rng.standard_normal((args.batch, 3, args.image_size, args.image_size), np.float32))
    labels = paddle.to_tensor(rng.integers(0, 10, args.batch))
    steps = {name: _stepper(m, images, labels) for name, m in models.items()}
    for step in steps.values():
        for _ in range(3):
            step()
    ratios, times = [], {name: [] for name in steps}
    for i in range(args.pairs):
        order = ["converted", "hand-written"] if i % 2 == 0 else ["hand-written", "converted"]
        took = {name: steps[name]() for name in order}
        for name, seconds in took.items():
            times[name].append(seconds)
        ratios.append(took["converted"] / took["hand-written"])
    median, low, high = median_ci(ratios)
    result = {
        "model": args.model,
        "parameters": parameters,
        "image_size": args.image_size,
        "batch": args.batch,
        "threads": args.threads,
        "pairs": args.pairs,
        "cpu": cpu(),
        "paddle": paddle.__version__,
        "step_s_median": {name: float(np.median(t)) for name, t in times.items()},
        "ratio_converted_over_hand_written": {"median": median, "ci95": [low, high]},
    }
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    ms = {name: f"{seconds * 1e3:.1f} ms" for name, seconds in result["step_s_median"].items()}
    print(
        f"{args.model}: converted / hand-written step {median:.3f} [{low:.3f}, {high:.3f}] ({args.pairs} pairs; "
        f"{ms['converted']} vs {ms['hand-written']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
