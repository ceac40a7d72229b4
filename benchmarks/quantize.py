"""Quantization of ResNet18 on Fashion-MNIST on both frameworks, side by side in one run.

    python benchmarks/quantize.py [--run-dir DIR] [--epochs 1] [--qat-steps 100] [--out benchmarks/results/quantize]

Trains ResNet18 on Fashion-MNIST with torch (``experiment=fashion_mnist_resnet18`` with the ImageNet
stem at 32x32 and the crop, the model docs/quantization.md's table was measured on, shortened to
``--epochs``) unless --run-dir names a run with a checkpoint, then quantizes that one checkpoint
with every method in both frameworks (its weights convert exactly, so both start from the same
fp32 model and the same held-out accuracy): ``python -m unitrain.quantize -m <run>
method=dynamic,static,qat backend=torch,paddle``. Every artifact is scored on the 10,000 test
images and timed at batch 1 and 32 in every runtime that reads it. The combined table
(``quantize.md``) and each job's ``quantize.json`` are copied to --out.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run-dir", help="a run directory with a checkpoint (default: train ResNet18 on Fashion-MNIST)"
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--qat-steps", type=int, default=100)
    parser.add_argument("--methods", default="dynamic,static,qat")
    parser.add_argument("--backends", default="torch,paddle")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-samples", type=int, default=0, help="held-out samples per row (0: all 10,000)")
    parser.add_argument("--out", default=str(HERE / "results" / "quantize"))
    return parser.parse_args()


def _train(args, run_dir: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "unitrain",
            "backend=torch",
            "experiment=fashion_mnist_resnet18",
            "model=resnet18",
            "data.image_size=32",
            "data.augment=standard",
            f"trainer.epochs={args.epochs}",
            "trainer.eval_every=0",
            "trainer.checkpoint_every=468",
            f"trainer.threads={args.threads}",
            f"hydra.run.dir={run_dir}",
        ],
        check=True,
    )


def _quantize(args, run_dir: Path, sweep: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "unitrain.quantize",
            "-m",
            str(run_dir),
            f"method={args.methods}",
            f"backend={args.backends}",
            f"qat.steps={args.qat_steps}",
            f"threads={args.threads}",
            f"eval_samples={args.eval_samples}",
            f"hydra.sweep.dir={sweep}",
        ],
        check=True,
    )


def main() -> int:
    args = _parse_args()
    with tempfile.TemporaryDirectory(prefix="unitrain-bench-quantize-") as tmp:
        run_dir = Path(args.run_dir) if args.run_dir else Path(tmp) / "run"
        if not args.run_dir:
            _train(args, run_dir)
        sweep = Path(tmp) / "quantize"
        _quantize(args, run_dir, sweep)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(sweep / "quantize.md", out / "quantize.md")
        for report in sweep.glob("*/quantize.json"):
            shutil.copy(report, out / f"{report.parent.name}.json")
    print(f"\nresults: {out / 'quantize.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
