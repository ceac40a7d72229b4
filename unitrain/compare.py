"""``python -m unitrain.compare <run-or-multirun-dirs...>``: the comparison report of training runs.

Writes comparison.md (also printed), curves.png, throughput.png, step_time.png and a
self-contained report.html into the output directory (the first argument by default); the
work is :mod:`unitrain.report.training`'s.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Sequence

from unitrain.launch.arguments import OneLineParser
from unitrain.report.training import write_report


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m unitrain.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", help="run directories, multirun directories, or both")
    parser.add_argument("--out", help="where to write the report (default: the first directory)")
    parser.add_argument("--baseline", type=int, default=0, help="row that ratios refer to (default 0)")
    parser.add_argument(
        "--target-loss",
        type=float,
        help="also report the time each run took to reach this loss (a language model: its held-out loss)",
    )
    parser.add_argument(
        "--target-accuracy",
        type=float,
        help="also report the wall time (training + evaluation) and steps until held-out top-1 first reached this",
    )
    args = parser.parse_args(argv)
    problem = None
    if args.target_accuracy is not None and not 0 < args.target_accuracy <= 1:
        problem = f"--target-accuracy={args.target_accuracy} is not allowed: a fraction in (0, 1]"
    elif args.target_loss is not None and not (math.isfinite(args.target_loss) and args.target_loss > 0):
        # A cross-entropy is never below 0, and 0 is reached only by a perfect model: never.
        problem = f"--target-loss={args.target_loss} is not allowed: a finite number > 0 (a loss to reach)"
    if problem:
        print(f"unitrain.compare: error: {problem}", file=sys.stderr)
        return 2
    try:
        text = write_report(args.dirs, args.out, args.baseline, args.target_loss, args.target_accuracy)
    except (FileNotFoundError, ValueError) as err:
        print(f"unitrain.compare: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        where = args.out or args.dirs[0]
        print(
            f"unitrain.compare: error: --out={where!r} is not allowed: {err.strerror or err}; "
            "allowed: a directory this user can write",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out or args.dirs[0])
    print(f"{text}\n\nreport: {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    from unitrain.host.processes import run_command

    run_command(main)
