"""``python -m unitrain.make_criteo --rows N --out DIR``: Criteo-format files for tests and
benchmarks of the parameter-server job, labelled by a hidden teacher.

Writes ``DIR/train/part-*.tsv`` (the training rows, split into ``--parts`` files) and
``DIR/held_out.tsv`` (rows from a separate stream), and reports the teacher's own AUC on the
held-out rows: the ceiling any model trained on them can reach. Train on them with
``data=criteo data.path=DIR/train data.val_path=DIR/held_out.tsv``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from rich.progress import Progress

from unitrain.data.criteo import CARDINALITIES
from unitrain.data.criteo_files import write_synthetic
from unitrain.errors import UnitrainError
from unitrain.host.atomic import cannot_write_beside
from unitrain.launch.arguments import OneLineParser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m unitrain.make_criteo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=_positive, required=True, help="training rows")
    parser.add_argument("--out", required=True, help="a folder that does not exist yet")
    parser.add_argument("--parts", type=_positive, default=1, help="files the training rows are split into")
    parser.add_argument("--held-out", type=int, default=10_000, help="held-out rows (default 10000)")
    parser.add_argument("--seed", type=int, default=2024, help="the teacher's and the rows' seed")
    parser.add_argument(
        "--cardinality",
        choices=sorted(CARDINALITIES),
        default="small",
        help="the categorical slots' sizes: small (4 to 2,000 values each) or criteo (Criteo's own: up to 10 million)",
    )
    return parser


def _check(args: argparse.Namespace, out: Path) -> None:
    """What cannot be written, refused before any row is drawn: --out a new folder in a folder
    this process can write, --held-out and --parts in range."""
    if out.exists():
        raise UnitrainError(
            f"--out={args.out!r} is not allowed: it exists; allowed: a new folder (nothing is overwritten)"
        )
    why = cannot_write_beside(out)
    if why:
        raise UnitrainError(
            f"--out={args.out!r} is not allowed: {why}; allowed: a new folder in a folder you can write"
        )
    if args.held_out < 0 or args.parts > args.rows:
        raise UnitrainError(
            f"--parts={args.parts} is not allowed: 1 to --rows={args.rows}"
            if args.parts > args.rows
            else f"--held-out={args.held_out} is not allowed: 0 or more"
        )


def _write(args: argparse.Namespace, out: Path) -> Any:
    """The rows written under ``out``, a progress bar on a terminal."""
    with Progress(transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("rows", total=args.rows)
        return write_synthetic(
            out,
            args.rows,
            args.held_out,
            args.parts,
            args.seed,
            lambda done: bar.update(task, completed=done),
            args.cardinality,
        )


def _report(args: argparse.Namespace, out: Path, written: Any) -> None:
    """teacher.json, and what was written and how to train on it."""
    report = {
        "rows": written.rows,
        "parts": len(written.train),
        "held_out_rows": written.held_out_rows,
        "seed": args.seed,
        "cardinality": args.cardinality,
        "teacher_auc": written.teacher_auc,
        "teacher_logloss": written.teacher_logloss,
    }
    (out / "teacher.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{written.rows} rows in {len(written.train)} files under {out / 'train'}, {written.held_out_rows} held out in "
        f"{written.held_out}; the teacher's own held-out AUC {written.teacher_auc:.4f}, log loss "
        f"{written.teacher_logloss:.4f} (the ceiling)"
    )
    print(f"train on them: data=criteo data.path={out / 'train'} data.val_path={written.held_out}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = Path(args.out)
    try:
        _check(args, out)
        written = _write(args, out)
    except UnitrainError as err:
        print(f"unitrain.make_criteo: error: {err}", file=sys.stderr)
        return 2
    _report(args, out, written)
    return 0


if __name__ == "__main__":
    from unitrain.host.processes import run_command

    run_command(main)
