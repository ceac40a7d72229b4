"""``python -m unitrain.maxbatch [--memory-limit 8GiB] [job overrides...]``: the largest batch that fits.

Each trial is ``python -m unitrain <overrides> trainer.batch_size=B`` for a few steps in a
process of its own, with B doubling from ``--start`` until a trial does not fit, then bisecting.
On an accelerator the framework's out-of-memory error decides; on the CPU, ``--memory-limit``
stands for the device's memory. Writes ``maxbatch.json`` into ``--out``; the search is
:mod:`unitrain.launch.largest_batch`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional, Tuple

from unitrain.launch.arguments import OneLineParser
from unitrain.launch.largest_batch import Search, UsageError, has_accelerator, parse_megabytes


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m unitrain.maxbatch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--memory-limit", help="on the CPU: the memory a trial may use (e.g. 4GiB); required there")
    parser.add_argument("--start", type=int, default=16, help="the first batch tried (default 16)")
    parser.add_argument("--max", type=int, default=4096, help="stop searching above this batch (default 4096)")
    parser.add_argument("--steps", type=int, default=2, help="training steps per trial (default 2)")
    # One add_argument per option, as infer.py's: alike in shape, each its own option.
    parser.add_argument(
        "--resolution",
        type=int,
        default=1,
        help="stop bisecting when the batch that fits and the one that does not are this close (default 1)",
    )
    parser.add_argument("--out", help="where maxbatch.json goes (default: a new runs/maxbatch/<time> directory)")
    return parser


def _checked(args: argparse.Namespace, overrides: List[str]) -> Tuple[Optional[float], Path]:
    """The memory limit in MiB (None on an accelerator) and the output folder, or one line
    naming the first option that is not allowed."""
    if args.start < 1 or args.max < args.start or args.steps < 1 or args.resolution < 1:
        raise UsageError(
            f"--start={args.start} --max={args.max} --steps={args.steps} --resolution={args.resolution} is not "
            "allowed: 1 <= start <= max, steps >= 1 and resolution >= 1"
        )
    searched = ("trainer.batch_size", "trainer.steps", "hydra.run.dir")
    bad = [o for o in overrides if o.startswith("-") or o.split("=")[0] in searched]
    if bad:
        raise UsageError(
            f"{bad[0]!r} is not allowed: job overrides (key=value) other than trainer.batch_size, trainer.steps "
            "and hydra.run.dir, which the search sets"
        )
    limit = parse_megabytes(args.memory_limit) if args.memory_limit else None
    out = Path(args.out or Path("runs") / "maxbatch" / time.strftime("%Y-%m-%d_%H-%M-%S"))
    if (out / "maxbatch.json").exists():
        raise UsageError(
            f"--out={str(out)!r} is not allowed: it holds an earlier search's maxbatch.json; allowed: a new directory"
        )
    if limit is None and not has_accelerator(overrides):
        raise UsageError(
            "--memory-limit is required on the CPU (for example --memory-limit 4GiB): a CPU job does not fail "
            "when memory runs out, the machine does"
        )
    return limit, out


def _say(line: str) -> None:
    print(line, flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    args, overrides = _parser().parse_known_args(argv)
    try:
        limit, out = _checked(args, overrides)
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="unitrain-maxbatch-") as work:
            search = Search(overrides, limit, args.steps, Path(work))
            print(
                f"searching the largest batch for: {' '.join(overrides) or '(the default job)'}"
                + (f", memory limit {limit:.0f} MiB" if limit else ", until the framework's out-of-memory error"),
                flush=True,
            )
            best = search.run(args.start, args.max, report=_say, resolution=args.resolution)
    except UsageError as err:
        print(f"unitrain.maxbatch: error: {err}", file=sys.stderr)
        return 2
    result = {
        "overrides": overrides,
        "memory_limit_mb": limit,
        "max_batch_size": best,
        "searched_up_to": args.max,
        "resolution": args.resolution,
        "trials": [asdict(t) for t in search.trials],
    }
    (out / "maxbatch.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"largest batch that fits: {best}"
        + (" (the --max searched)" if best == args.max else "")
        + f"; written to {out / 'maxbatch.json'}"
    )
    return 0


if __name__ == "__main__":
    from unitrain.host.processes import run_command

    run_command(main)
