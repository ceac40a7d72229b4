"""``python -m unitrain.make_criteo --rows N --out DIR``: Criteo-format files for tests and
benchmarks of the parameter-server job, labelled by a hidden teacher.

Writes ``DIR/train/part-*.tsv`` (the training rows, split into ``--parts`` files) and
``DIR/held_out.tsv`` (rows from a separate stream), and reports the teacher's own AUC on the
held-out rows: the ceiling any model trained on them can reach. Train on them with
``data=criteo data.path=DIR/train data.val_path=DIR/held_out.tsv``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from rich.progress import Progress

from unitrain.data.criteo import CARDINALITIES
from unitrain.data.criteo_files import write_synthetic
from unitrain.errors import UnitrainError
from unitrain.host.atomic import cannot_create_in
from unitrain.launch.arguments import OneLineParser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def main(argv: Sequence[str] | None = None) -> int:
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
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        if out.exists():
            raise UnitrainError(
                f"--out={args.out!r} is not allowed: it exists; allowed: a new folder (nothing is overwritten)"
            )
        if not out.parent.is_dir():
            raise UnitrainError(f"--out={args.out!r} is not allowed: {out.parent} is not a folder")
        why = cannot_create_in(out.parent)
        if why:
            raise UnitrainError(
                f"--out={args.out!r} is not allowed: {out.parent}: {why}; allowed: a folder you can write"
            )
        if args.held_out < 0 or args.parts > args.rows:
            raise UnitrainError(
                f"--parts={args.parts} is not allowed: 1 to --rows={args.rows}"
                if args.parts > args.rows
                else f"--held-out={args.held_out} is not allowed: 0 or more"
            )
        with Progress(transient=True, disable=not sys.stderr.isatty()) as bar:
            task = bar.add_task("rows", total=args.rows)
            written = write_synthetic(
                out,
                args.rows,
                args.held_out,
                args.parts,
                args.seed,
                lambda done: bar.update(task, completed=done),
                args.cardinality,
            )
    except UnitrainError as err:
        print(f"unitrain.make_criteo: error: {err}", file=sys.stderr)
        return 2
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
    return 0


if __name__ == "__main__":
    from unitrain.host.processes import run_command

    run_command(main)
