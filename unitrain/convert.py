"""``python -m unitrain.convert <checkpoint> --to torch|paddle``: a checkpoint as native weights.

The output loads with plain framework code, no unitrain needed:
``model.load_state_dict(torch.load(path))`` or ``layer.set_state_dict(paddle.load(path))``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from unitrain.errors import UnitrainError
from unitrain.interface.backend import get_backend
from unitrain.interface.modules import available_backends
from unitrain.interface.weights import weights_module
from unitrain.launch.arguments import OneLineParser
from unitrain.model.transfer import converted
from unitrain.train.checkpoint import find_checkpoint, read_image_meta, read_model_arrays


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m unitrain.convert",
        description="Turn a unitrain checkpoint into a framework's native weights file.",
    )
    parser.add_argument(
        "checkpoint",
        help=(
            "a checkpoint directory, a run directory (its latest checkpoint), or latest (the newest under ./runs and "
            "./multirun)"
        ),
    )
    parser.add_argument("--to", required=True, choices=available_backends(), help="the framework whose format to write")
    parser.add_argument("--out", help="output file (default: <checkpoint>/model.<framework>.pt|pdparams)")
    args = parser.parse_args(argv)
    target = weights_module(args.to)
    try:
        path = find_checkpoint(args.checkpoint, [Path.cwd() / "runs", Path.cwd() / "multirun"], key="checkpoint")
        meta = read_image_meta(path, "unitrain.convert")
        out = Path(args.out) if args.out else path / f"model.{args.to}{target.NATIVE_SUFFIX}"
        if out.is_dir() or not out.parent.is_dir():
            why = "is a directory" if out.is_dir() else f"its directory {out.parent} does not exist"
            raise UnitrainError(
                f"--out={str(out)!r} is not allowed: {why}; allowed: a file path in an existing directory"
            )
        # get_backend imports the framework the way unitrain does (and fails clearly if it is missing).
        arrays = converted(read_model_arrays(path), meta, get_backend(args.to))
        try:
            target.save_native(arrays, out)
        except OSError as err:
            raise UnitrainError(
                f"--out={str(out)!r} is not allowed: {err.strerror or err}; allowed: a file path this user can write"
            ) from None
    except UnitrainError as err:
        print(f"unitrain.convert: error: {err}", file=sys.stderr)
        return 2
    print(f"{meta['framework']} checkpoint {path} (model={meta['model']}, step {meta['step']}) -> {args.to}: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
