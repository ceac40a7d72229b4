"""What unitrain's training step adds, measured in one process with nothing else different.

    python benchmarks/loop_overhead.py --backend torch --model resnet50 --image-size 64 --steps 20 --out result.json

Builds one Job with unitrain's own Trainer.setup (model, optimizer, loader), then alternates,
step by step, Trainer.train_step with a hand-written step on the same model, optimizer and
batch stream (forward, cross-entropy, backward, optimizer step, clear the gradients), so that
machine drift, the process and the model are the same for both. Which goes first alternates.
Writes each step's wall and CPU (process) seconds for both.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def _parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("paddle", "torch"), required=True)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="steps of each kind, after 2 of each as warm-up")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def _config(args):
    # Imported here so that --help does not wait for hydra and the frameworks.
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from unitrain.config.schema import register_configs

    register_configs()
    total = 2 * (args.steps + 2)
    overrides = [
        f"backend={args.backend}",
        f"model={args.model}",
        f"data.image_size={args.image_size}",
        f"trainer.steps={total}",
        "trainer.batch_size=16",
        f"trainer.threads={args.threads}",
        "optim.lr=0.02",
    ]
    with initialize_config_module(config_module="unitrain.conf", version_base=None):
        return OmegaConf.to_object(compose("config", overrides=overrides))


def _alternate(args, backend, trainer, job) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) seconds of every step of each kind, warm-up included."""
    batches = iter(job.loader)

    def by_hand(step: int) -> None:
        images, labels = next(batches)
        loss = backend.loss(job.model(images), labels)
        loss.backward()
        job.optimizer.step()
        job.optimizer.clear_grad() if args.backend == "paddle" else job.optimizer.zero_grad()

    def unitrain(step: int) -> None:
        trainer.train_step(job, step, batches)

    times = {"unitrain": [], "by_hand": []}
    for i in range(args.steps + 2):
        kinds = [("unitrain", unitrain), ("by_hand", by_hand)]
        for name, step in kinds if i % 2 == 0 else kinds[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            step(i)
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return times


def main(argv=None) -> int:
    args = _parse_args(argv)

    from unitrain.host.threads import export_threads
    from unitrain.interface.backend import get_backend
    from unitrain.train.trainer import Trainer

    cfg = _config(args)
    export_threads(args.threads)
    backend = get_backend(args.backend)
    backend.set_threads(args.threads)
    trainer = Trainer(cfg, backend, tempfile.mkdtemp(prefix="unitrain-loop-"), args.threads)
    with backend.distributed(cfg.dist, "cpu") as dist:
        job = trainer.setup(dist)
        trainer.train_mode(job)
        times = _alternate(args, backend, trainer, job)
    Path(args.out).write_text(json.dumps({k: v[2:] for k, v in times.items()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
