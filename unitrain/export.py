"""``python -m unitrain.export <run dir | checkpoint | latest> --format native,onnx [--to torch,paddle]``

Writes deployable models from a checkpoint, in either framework's native format (torch.export
``.pt2``; Paddle inference program ``.json`` + ``.pdiparams``) and as ONNX (torch.onnx.export;
paddle2onnx), whichever framework trained it. Each artifact is loaded back with its own runtime
and compared with the checkpoint before it is kept; the work is :mod:`unitrain.deploy.export`'s.
A language model (data=text) takes int64 token ids with a dynamic batch and time axis (up to its
context), and its run's tokenizer goes with it.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from unitrain.deploy import artifacts
from unitrain.deploy.export import export
from unitrain.deploy.export_check import TOLERANCE, ExportCheckError
from unitrain.errors import UnitrainError
from unitrain.interface.export import FORMATS
from unitrain.interface.modules import available_backends
from unitrain.launch.arguments import OneLineParser
from unitrain.tracking import mlflow_runs


def _csv(value: str, allowed: Sequence[str], key: str) -> List[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    items = list(allowed) if items == ["all"] else items
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise UnitrainError(f"{key}={value!r} is not allowed: a comma-separated list of {', '.join(allowed)}, or all")
    return list(dict.fromkeys(items))


def _batches(value: Optional[str]) -> List[Optional[int]]:
    if not value:
        return [None]
    try:
        sizes = [int(v) for v in value.split(",")]
    except ValueError:
        sizes = [0]
    if any(s < 1 for s in sizes):
        raise UnitrainError(
            f"--batch={value!r} is not allowed: positive integers, comma-separated (leave it out for any batch size)"
        )
    return list(dict.fromkeys(sizes))


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m unitrain.export", description=__doc__.split("\n\n")[0].strip("`"))
    parser.add_argument(
        "checkpoint",
        help=(
            "a run directory (its latest checkpoint), a checkpoint directory, or latest (the newest under ./runs and "
            "./multirun)"
        ),
    )
    parser.add_argument("--format", default="native", help="native, onnx, or both comma-separated (default: native)")
    parser.add_argument(
        "--to", help="framework(s) to export for: torch, paddle, or both (default: the checkpoint's own)"
    )
    parser.add_argument("--batch", help="fixed batch size(s), comma-separated (default: any batch size)")
    parser.add_argument("--out", help="export directory (default: <run dir>/export)")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=TOLERANCE,
        help=f"largest allowed |logit difference| relative to the largest |logit| (default {TOLERANCE:g})",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    # Paddle's C++ log (read when paddle is first imported) warns at every jit.save about a PIR
    # feature unitrain does not use; errors still show.
    os.environ.setdefault("GLOG_minloglevel", "2")
    try:
        formats = _csv(args.format, FORMATS, "--format")
        targets = _csv(args.to, available_backends(), "--to") if args.to else None
        if not (np.isfinite(args.tolerance) and args.tolerance > 0):
            raise UnitrainError(f"--tolerance={args.tolerance} is not allowed: a finite number > 0")
        out = export(args.checkpoint, formats, targets, _batches(args.batch), args.out, args.tolerance)
    except ExportCheckError as err:
        print(f"unitrain.export: error: {err}", file=sys.stderr)
        return 1
    except UnitrainError as err:
        print(f"unitrain.export: error: {err}", file=sys.stderr)
        return 2
    print(f"export.json: {out / artifacts.MANIFEST}")
    _track(out)
    return 0


def _track(out: Path) -> None:
    """The manifest joins the checkpoint's run in MLflow, when that run is tracked."""
    checkpoint = Path(artifacts.read_manifest(out)["source"]["checkpoint"])
    for folder in (checkpoint, *checkpoint.parents[:3]):
        tracked = mlflow_runs.TrackedRun.read(folder)
        if tracked is not None:
            mlflow_runs.log_files(tracked, [out / artifacts.MANIFEST], "export")
            print(f"MLflow: export.json logged to run {tracked.run_id} ({mlflow_runs.public_uri(tracked.uri)})")
            return


if __name__ == "__main__":
    from unitrain.host.processes import run_command

    run_command(main)
