"""Inference latency of ResNet50 in every runtime, side by side in one run on this machine.

    python benchmarks/inference.py [--run-dir DIR] [--threads 2] [--out benchmarks/results/inference]

Trains ResNet50 (64x64, learnable data) for a few steps with torch unless --run-dir names a
run with a checkpoint, exports it in all four forms (torch.export, Paddle inference program,
ONNX from each framework), and runs ``python -m unitrain.infer`` at batch 1 and 32 with the
same threads for every runtime. The weights are barely trained: the accuracy column only
shows that every runtime computes the same thing; the latency is what this measures.
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
    parser.add_argument("--run-dir", help="a run directory with a checkpoint (default: train ResNet50 for 2 steps)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-samples", type=int, default=256)
    parser.add_argument("--out", default=str(HERE / "results" / "inference"))
    return parser.parse_args()


def _train(run_dir: Path, threads: int) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "unitrain",
            "backend=torch",
            "model=resnet50",
            "data=learnable",
            "data.image_size=64",
            "data.val_samples=512",
            "trainer.batch_size=16",
            "trainer.steps=2",
            "trainer.checkpoint_every=2",
            f"trainer.threads={threads}",
            "trainer.progress=false",
            f"hydra.run.dir={run_dir}",
        ],
        check=True,
    )


def _export(run_dir: Path, export: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "unitrain.export",
            str(run_dir),
            "--format",
            "native,onnx",
            "--to",
            "torch,paddle",
            "--out",
            str(export),
        ],
        check=True,
    )


def _infer(export: Path, result: Path, threads: int, eval_samples: int) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "unitrain.infer",
            str(export),
            "--batch",
            "1,32",
            "--threads",
            str(threads),
            "--eval-samples",
            str(eval_samples),
            "--out",
            str(result),
        ],
        check=True,
    )


def main() -> int:
    args = _parse_args()
    with tempfile.TemporaryDirectory(prefix="unitrain-bench-infer-") as tmp:
        run_dir = Path(args.run_dir) if args.run_dir else Path(tmp) / "run"
        if not args.run_dir:
            _train(run_dir, args.threads)
        export = Path(tmp) / "export"
        _export(run_dir, export)
        result = Path(tmp) / "inference"
        _infer(export, result, args.threads, args.eval_samples)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name in ("inference.json", "inference.md", "inference.png"):
            shutil.copy(result / name, out / name)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
