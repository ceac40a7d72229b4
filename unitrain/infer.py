"""``python -m unitrain.infer <export dirs | run dirs | model files> [--batch 1,32] [--threads N]``

Runs every exported model in each runtime that reads it and times it side by side: Paddle
Inference (with and without its IR and oneDNN optimizations) and ``paddle.jit.load`` on Paddle
programs, torch eager and ``torch.compile`` on ExportedPrograms, ONNX Runtime on either
framework's ONNX. Each artifact runs in a process of its own; held-out accuracy is measured in
the same run for every row (a language model's: next-token top-1 and loss per token, its
throughput in tokens/s too). Writes ``inference.json``, ``inference.md`` and ``inference.png``;
the work is :mod:`unitrain.deploy.infer`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import List, Sequence

import numpy as np

from unitrain.deploy import artifacts, ps_export
from unitrain.deploy.infer import RESULT, Timing, benchmark, worker
from unitrain.deploy.speed_ratio import MAX_PAIRS, ratio_worker
from unitrain.errors import UnitrainError
from unitrain.launch.arguments import OneLineParser
from unitrain.report.inference import markdown


def _ints(value: str, key: str) -> List[int]:
    try:
        items = sorted(dict.fromkeys(int(v) for v in value.split(",")))
    except ValueError:
        items = [0]
    if not items or items[0] < 1:
        raise UnitrainError(f"{key}={value!r} is not allowed: positive integers, comma-separated")
    return items


def _add_timing_arguments(parser: argparse.ArgumentParser) -> None:
    """How every runtime is timed; _timing checks the values, since argparse only checks their types."""
    cores = len(os.sched_getaffinity(0))
    parser.add_argument(
        "--threads", type=int, default=cores, help="threads for every runtime (default: the CPUs this process may use)"
    )
    parser.add_argument(
        "--eval-samples", type=int, default=0, help="held-out samples for the accuracy column (default 0: all)"
    )
    # One add_argument per option, as maxbatch.py's: alike in shape, each its own option.
    parser.add_argument(
        "--warmup",
        type=int,
        default=5,
        help="untimed runs per batch size first (default 5; torch.compile compiles in them)",
    )
    parser.add_argument("--min-iters", type=int, default=20, help="timed runs at least (default 20)")
    parser.add_argument(
        "--pairs",
        type=int,
        default=10,
        help="interleaved pairs behind each row's ratio to the first row (default 10; 0: no ratios)",
    )
    parser.add_argument(
        "--min-time", type=float, default=2.0, help="and at least this many seconds of timed runs (default 2)"
    )


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m unitrain.infer",
        description="Time exported models in every runtime that reads them, side by side.",
    )
    parser.add_argument(
        "inputs", nargs="+", help="export directories, run directories (their export/), or exported model files"
    )
    parser.add_argument(
        "--batch",
        help=(
            "batch sizes, comma-separated: latency at the smallest, throughput at the largest (default 1,32; with "
            "--criteo, the rows scored at a time, default 4096)"
        ),
    )
    _add_timing_arguments(parser)
    parser.add_argument(
        "--criteo",
        help=(
            "score the Criteo lines of this file or folder with a parameter-server model's export: AUC and log loss "
            "per model, and every line's click probability in --out (default: <export dir>/scores.tsv)"
        ),
    )
    parser.add_argument(
        "--out",
        help="output directory (default: <run dir>/inference/<time> for one run's models, else ./inference/<time>)",
    )
    return parser


def _timing(args: argparse.Namespace) -> Timing:
    """The options as a Timing, or one line naming the first that is not allowed."""
    batches = _ints(args.batch or "1,32", "--batch")
    cores = len(os.sched_getaffinity(0))
    if not 1 <= args.threads <= cores:
        raise UnitrainError(f"--threads={args.threads} is not allowed: 1 to {cores} (the CPUs this process may use)")
    for key, value in (("--eval-samples", args.eval_samples), ("--warmup", args.warmup), ("--min-time", args.min_time)):
        if not (value >= 0 and np.isfinite(value)):
            raise UnitrainError(f"{key}={value} is not allowed: a number >= 0")
    if args.min_iters < 1:
        raise UnitrainError(f"--min-iters={args.min_iters} is not allowed: an integer >= 1")
    if args.pairs < 0 or args.pairs == 1 or args.pairs > MAX_PAIRS:
        raise UnitrainError(f"--pairs={args.pairs} is not allowed: 0 (no ratios) or 2 to {MAX_PAIRS}")
    return Timing(
        batches=batches,
        threads=args.threads,
        eval_samples=args.eval_samples,
        warmup=args.warmup,
        min_iters=args.min_iters,
        min_time_s=args.min_time,
        pairs=args.pairs,
    )


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] in ("--worker", "--ratio"):
        return (worker if sys.argv[1] == "--worker" else ratio_worker)(sys.argv[2])
    args = _parser().parse_args(argv)
    if args.criteo:
        return _score(args)
    try:
        out = benchmark(args.inputs, _timing(args), args.out)
    except UnitrainError as err:
        print(f"unitrain.infer: error: {err}", file=sys.stderr)
        return 2
    result = json.loads((out / RESULT).read_text())
    print("\n" + markdown(result) + f"\n\n{RESULT}: {out / RESULT}\nplot: {out / 'inference.png'}")
    failed = [r for r in result["rows"] if "error" in r]
    if failed:
        print(
            f"unitrain.infer: error: {len(failed)} runtime(s) failed: "
            + "; ".join(f"{r['runtime']} on {r['name']}: {r['error']}" for r in failed),
            file=sys.stderr,
        )
        return 1
    return 0


def _score(args: argparse.Namespace) -> int:
    """A parameter-server model's export scoring Criteo lines."""
    try:
        if len(args.inputs) != 1:
            raise UnitrainError(f"--criteo takes one export directory, not {len(args.inputs)} inputs")
        directory, _ = artifacts.locate(args.inputs[0])
        manifest = artifacts.read_manifest(directory)
        if manifest.get("kind") != ps_export.KIND:
            raise UnitrainError(
                f"--criteo is not allowed with {directory}: it holds image models; allowed: the export of a "
                "parameter-server job"
            )
        out = Path(args.out) if args.out else directory / "scores.tsv"
        batch = _ints(args.batch or "4096", "--batch")[-1]
        result = ps_export.score(directory, manifest, args.criteo, batch, args.threads, out)
    except UnitrainError as err:
        print(f"unitrain.infer: error: {err}", file=sys.stderr)
        return 2
    for name, model in result["models"].items():
        print(
            f"{name}: AUC {model['auc']:.4f}  log loss {model['logloss']:.4f}  max |probability diff| from the "
            f"reference {model['max_abs_diff_from_reference']:.2g}"
        )
    print(
        f"{result['rows']} rows ({result['unknown_ids']:.1%} of their ids unknown to the tables) in "
        f"{result['seconds']:.1f} s; probabilities: {result['scores']}"
    )
    return 0


if __name__ == "__main__":
    from unitrain.host.processes import run_command

    run_command(main)
