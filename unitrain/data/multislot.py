"""Criteo lines as MultiSlot text, the line format of Paddle's dataset readers (MultiSlotDataFeed).

An engine that reads files itself (Paddle's QueueDataset) runs ``python -m unitrain.data.multislot``
as its pipe command: each file's lines come in on stdin and leave, parsed and standardized
exactly as unitrain's own reader does them (:func:`unitrain.data.criteo.parse_numbered`), as one
line per row of slots in the order the program declares them: ``13 <dense...> 26 <ids...> 1 <label>``.
A bad line ends the command with one line naming the file and line, on stderr and in a file of
``--errors``: Paddle's reader ignores a failed pipe command (it goes on with the next file), so
the trainer looks there after the pass and fails the job with that line.

Nothing here imports a framework: the command starts once per file and per reader thread.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from itertools import islice
from pathlib import Path
from typing import IO, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from unitrain.data.criteo import DENSE_FEATURES, SPARSE_SLOTS, CtrData, parse_numbered
from unitrain.data.criteo_files import Standardize
from unitrain.errors import UnitrainError
from unitrain.host.atomic import replace_text

#: Rows parsed and written at a time.
BLOCK = 4096
SOURCE = "the Criteo file on the reader's stdin"


def encode(rows: CtrData) -> str:
    """MultiSlot text of ``rows``: per line, each slot's value count, then its values."""
    dense = np.char.mod("%.9g", rows.dense)
    ids = rows.sparse.astype(str)
    columns = [
        np.full((len(rows), 1), str(DENSE_FEATURES)),
        dense,
        np.full((len(rows), 1), str(SPARSE_SLOTS)),
        ids,
        np.full((len(rows), 1), "1"),
        np.char.mod("%d", rows.label.reshape(-1, 1)),
    ]
    table = np.concatenate(columns, axis=1)
    return "\n".join(" ".join(line) for line in table.tolist()) + "\n"


def _blocks(lines: Iterable[str]) -> Iterator[List[Tuple[str, int, str]]]:
    numbered = ((SOURCE, number, line) for number, line in enumerate(lines, 1))
    while block := list(islice(numbered, BLOCK)):
        yield block


def convert(lines: Iterable[str], out: IO[str], buckets: int, standardize: Standardize) -> int:
    """Every line of ``lines`` to ``out``; the rows written."""
    rows = 0
    for block in _blocks(lines):
        parsed = standardize(parse_numbered(block, buckets))
        out.write(encode(parsed))
        rows += len(parsed)
    return rows


def command(python: str, buckets: int, standardize: Standardize, errors: Path) -> str:
    """The pipe command that converts one file for the engine's reader; a bad line's message
    lands in the folder ``errors`` (see :func:`first_error`)."""
    mean = ",".join(repr(float(v)) for v in standardize.mean)
    std = ",".join(repr(float(v)) for v in standardize.std)
    return (
        f"{python} -m unitrain.data.multislot --buckets {buckets} --mean {mean} --std {std} "
        f"--errors {shlex.quote(str(errors))}"
    )


def first_error(errors: Path) -> Optional[str]:
    """The message of a file a pipe command refused, if any did."""
    found = sorted(errors.glob("*.txt"))
    return found[0].read_text().strip() if found else None


def _reading() -> str:
    """The file this command converts: Paddle's reader runs ``( <this command> ) < "<file>"``,
    so stdin is the file itself."""
    try:
        path = os.readlink("/proc/self/fd/0")
    except OSError:
        return SOURCE
    return f"the Criteo file {path!r}" if os.path.isfile(path) else SOURCE


def _floats(text: str) -> np.ndarray:
    values = np.asarray([float(v) for v in text.split(",")], np.float32)
    if values.shape != (DENSE_FEATURES,):
        raise ValueError(text)
    return values


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unitrain.data.multislot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--buckets", type=int, required=True)
    parser.add_argument("--mean", type=_floats, required=True, help=f"{DENSE_FEATURES} comma-separated floats")
    parser.add_argument("--std", type=_floats, required=True, help=f"{DENSE_FEATURES} comma-separated floats")
    parser.add_argument("--errors", type=Path, required=True, help="a folder for the message of a bad line")
    args = parser.parse_args(argv)
    try:
        convert(sys.stdin, sys.stdout, args.buckets, Standardize(mean=args.mean, std=args.std))
    except UnitrainError as err:
        message = str(err).replace(SOURCE, _reading())
        print(f"unitrain.data.multislot: error: {message}", file=sys.stderr)
        replace_text(args.errors / f"{os.getpid()}.txt", message + "\n")
        return 1
    return 0


if __name__ == "__main__":
    from unitrain.host.processes import run_command

    run_command(main, stop_when_unread=True)  # a filter: a reader that stopped reading ends it
