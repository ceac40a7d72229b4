"""Criteo files of any size, read as a stream: one file or a folder of part files, each trainer
reading its share batch by batch, never the whole data in memory.

A job's rows are the lines of its parts in order (a folder's files sorted by name), numbered
globally. The training rows are ``[0, train)``, the held-out rows follow them (or come from
``data.val_path``). Trainer ``i`` of ``T`` reads

* whole files ``i, i+T, ...`` when there are at least ``T`` files (and more than one): no
  trainer reads a line it does not train on;
* otherwise every ``T``-th line from line ``i``, as :meth:`CtrData.shard` takes rows.

Every file is counted once before training (newlines in 1 MiB chunks), so that each trainer
knows how many whole batches every share holds: synchronous trainers must stop at the same step.
What a reader holds at a time is one batch of lines and its arrays.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from unitrain.data.criteo import HELD_OUT, TRAIN, CtrData, auc, log_loss, parse_numbered, synthetic_blocks
from unitrain.errors import ConfigError

CHUNK = 1 << 20
#: Rows of the head of the training rows whose dense features set the standardization that
#: every trainer applies (a bounded sample: the whole file may not fit in memory).
STATS_ROWS = 10_000
ALLOWED = "a Criteo TSV file (label, I1..I13, C1..C26 per line) or a folder of such part files"


@dataclass(frozen=True, kw_only=True)
class Part:
    path: str
    lines: int
    first: int  # global number of its first line


def count_lines(path: str) -> int:
    """Lines of a file, a last line without a newline included."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def list_files(path: str) -> List[str]:
    """``path`` itself, or a folder's visible files sorted by name."""
    if os.path.isfile(path):
        return [path]
    return sorted(str(p) for p in Path(path).iterdir() if p.is_file() and not p.name.startswith("."))


def check_source(path: Optional[str], key: str = "data.path") -> None:
    """What :func:`find_parts` would refuse, and a first line that is not a Criteo row, found
    without reading the whole files: before a job starts, not in every process after."""
    if not path or not os.path.exists(path):
        raise ConfigError(key, path, f"{ALLOWED}, existing")
    listed = list_files(path)
    if not listed:
        raise ConfigError(key, path, f"{ALLOWED}; this folder holds no files")
    files = [f for f in listed if os.path.getsize(f) > 0]
    if not files:
        raise ConfigError(key, path, f"{ALLOWED}; it holds no rows")
    with open(files[0], encoding="utf-8", errors="replace") as f:
        first = f.readline()
    parse_numbered([(files[0], 1, first)], buckets=2)


def find_parts(path: Optional[str], key: str = "data.path") -> List[Part]:
    """The files of ``path`` (a file, or a folder's visible files sorted by name), counted."""
    if not path or not os.path.exists(path):
        raise ConfigError(key, path, f"{ALLOWED}, existing")
    files = list_files(path)
    if not files:
        raise ConfigError(key, path, f"{ALLOWED}; this folder holds no files")
    parts, first = [], 0
    for file in files:
        lines = count_lines(file)
        parts.append(Part(path=file, lines=lines, first=first))
        first += lines
    if first == 0:
        raise ConfigError(key, path, f"{ALLOWED}; it holds no rows")
    return parts


@dataclass(frozen=True, kw_only=True)
class Segment:
    """Lines ``start, start+step, ... < stop`` of one file (numbered from 0 in the file)."""

    path: str
    start: int
    stop: int
    step: int = 1

    @property
    def rows(self) -> int:
        return len(range(self.start, self.stop, self.step))


def _clip(part: Part, begin: int, end: int) -> Tuple[int, int]:
    """The file's own line numbers of the global range [begin, end)."""
    return max(begin - part.first, 0), min(end - part.first, part.lines)


def shares(parts: Sequence[Part], begin: int, end: int, trainers: int) -> List[List[Segment]]:
    """Each trainer's segments of the global rows [begin, end)."""
    if len(parts) > 1 and len(parts) >= trainers:
        out: List[List[Segment]] = [[] for _ in range(trainers)]
        for j, part in enumerate(parts):
            start, stop = _clip(part, begin, end)
            if start < stop:
                out[j % trainers].append(Segment(path=part.path, start=start, stop=stop))
        return out
    out = [[] for _ in range(trainers)]
    for part in parts:
        start, stop = _clip(part, begin, end)
        for i in range(trainers):
            # The first line of this file whose global number is i modulo the trainers.
            first = start + (i - (part.first + start)) % trainers
            if first < stop:
                out[i].append(Segment(path=part.path, start=first, stop=stop, step=trainers))
    return out


def numbered_lines(segments: Sequence[Segment]) -> Iterator[Tuple[str, int, str]]:
    """(file, line number from 1, line) of every line of the segments, in order."""
    for seg in segments:
        source = f"the Criteo file {seg.path!r}"
        with open(seg.path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(islice(f, seg.start, seg.stop, seg.step), 0):
                yield source, seg.start + number * seg.step + 1, line


@dataclass(frozen=True, kw_only=True)
class Standardize:
    """The dense features' shift and scale, the same in every trainer."""

    mean: np.ndarray
    std: np.ndarray

    def __call__(self, rows: CtrData) -> CtrData:
        rows.dense = ((rows.dense - self.mean) / self.std).astype(np.float32)
        return rows

    @classmethod
    def of(cls, rows: CtrData) -> "Standardize":
        # Log counts sit around 0-8: plain SGD crawls on them uncentred.
        return cls(mean=rows.dense.mean(axis=0), std=rows.dense.std(axis=0) + 1e-6)


@dataclass(frozen=True, kw_only=True)
class FileRows:
    """One trainer's share of Criteo files, read batch by batch."""

    segments: Tuple[Segment, ...]
    buckets: int
    standardize: Standardize

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.segments)

    def whole_files(self) -> List[str]:
        """The share's files, each read whole (dist.ps.feed=engine gives the engine files)."""
        return [s.path for s in self.segments]

    def batches(self, batch_size: int, worker: int = 0, workers: int = 1, skip: int = 0) -> Iterator[CtrData]:
        """Batches ``skip+worker, skip+worker+workers, ...`` of the share's whole batches: loader
        workers each parse their own, and taken in turn they are the share's batches in order.
        The ``skip`` batches before them are read past, not parsed."""
        lines = numbered_lines(self.segments)
        for _ in islice(lines, skip * batch_size):
            pass
        index = 0
        while True:
            batch = list(islice(lines, batch_size))
            if len(batch) < batch_size:
                return
            if index % workers == worker:
                yield self.standardize(parse_numbered(batch, self.buckets))
            index += 1


class Share(Protocol):
    """What one trainer reads: its rows, batch by batch (loader ``worker`` of ``workers``
    parses batches worker, worker+workers, ...)."""

    @property
    def rows(self) -> int: ...

    def batches(self, batch_size: int, worker: int = 0, workers: int = 1, skip: int = 0) -> Iterator[CtrData]: ...


@dataclass(frozen=True, kw_only=True)
class MemoryRows:
    data: CtrData

    @property
    def rows(self) -> int:
        return len(self.data)

    def batches(self, batch_size: int, worker: int = 0, workers: int = 1, skip: int = 0) -> Iterator[CtrData]:
        for index, batch in enumerate(self.data.rows(slice(skip * batch_size, None)).batches(batch_size)):
            if index % workers == worker:
                yield batch


def read_head(parts: Sequence[Part], rows: int, buckets: int) -> CtrData:
    """The first ``rows`` rows of the parts, parsed."""
    lines = islice(numbered_lines([Segment(path=p.path, start=0, stop=p.lines) for p in parts]), rows)
    return parse_numbered(lines, buckets)


def read_range(parts: Sequence[Part], begin: int, end: int, buckets: int) -> CtrData:
    """The global rows [begin, end), parsed (held-out rows: the caller bounds them)."""
    segments = []
    for part in parts:
        start, stop = _clip(part, begin, end)
        if start < stop:
            segments.append(Segment(path=part.path, start=start, stop=stop))
    return parse_numbered(numbered_lines(segments), buckets)


def _write_train(
    folder: Path, rows: int, parts: int, seed: int, progress: Callable[[int], None], cardinality: str
) -> List[str]:
    folder.mkdir(parents=True)
    per_part, done = -(-rows // parts), 0
    files = [folder / f"part-{j:05d}.tsv" for j in range(parts)]
    handles = [f.open("w", encoding="utf-8") for f in files]
    try:
        for lines, _ in synthetic_blocks(rows, seed, TRAIN, cardinality):
            for line in lines:
                handles[done // per_part].write(line + "\n")
                done += 1
            progress(done)
    finally:
        for handle in handles:
            handle.close()
    return [f.name for f in files]


@dataclass(frozen=True, kw_only=True)
class Written:
    train: List[str]
    held_out: str
    rows: int
    held_out_rows: int
    teacher_auc: float
    teacher_logloss: float


def write_synthetic(
    out: Path,
    rows: int,
    held_out: int,
    parts: int,
    seed: int,
    progress: Callable[[int], None],
    cardinality: str = "small",
) -> Written:
    """Criteo-format part files of ``rows`` seeded rows under ``out/train/`` and ``held_out``
    rows from a separate stream in ``out/held_out.tsv``, labelled by the hidden teacher, whose
    own AUC on the held-out rows is the ceiling any model can reach. Written beside ``out`` and
    renamed into place, so an interrupted run leaves no half-written folder; ``progress`` gets
    the rows written so far; ``cardinality`` the slots' sizes (:data:`CARDINALITIES`)."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        files = _write_train(tmp / "train", rows, parts, seed, progress, cardinality)
        labels, scores = [], []
        with (tmp / "held_out.tsv").open("w", encoding="utf-8") as f:
            for lines, probabilities in synthetic_blocks(held_out, seed, HELD_OUT, cardinality):
                f.writelines(line + "\n" for line in lines)
                labels.extend(line[0] == "1" for line in lines)
                scores.append(probabilities)
        teacher = np.concatenate(scores) if scores else np.zeros(0)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.replace(tmp, out)
    return Written(
        train=[str(out / "train" / name) for name in files],
        held_out=str(out / "held_out.tsv"),
        rows=rows,
        held_out_rows=held_out,
        teacher_auc=auc(np.asarray(labels), teacher) if held_out else float("nan"),
        teacher_logloss=log_loss(np.asarray(labels), teacher) if held_out else float("nan"),
    )
