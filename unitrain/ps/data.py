"""The rows of a parameter-server job: each trainer's share, the held-out rows, the dense
features' standardization, the same for every trainer and both frameworks.

``data=criteo`` streams its files (:mod:`unitrain.data.criteo_files`): the training rows are
the first ``data.num_samples`` rows (all but the held-out ones when unset), the held-out rows
the first ``data.val_samples`` of ``data.val_path``, or without it the ``data.val_samples``
rows after the training ones. ``data=criteo_synthetic`` draws its rows in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from unitrain.data.criteo import HELD_OUT, CtrData, synthetic
from unitrain.data.criteo_files import (
    STATS_ROWS,
    FileRows,
    MemoryRows,
    Share,
    Standardize,
    find_parts,
    read_head,
    read_range,
    shares,
)
from unitrain.errors import ConfigError
from unitrain.tasks.click_through import from_files

#: Rows of data=criteo_synthetic when data.num_samples / data.val_samples are unset.
DEFAULT_ROWS, DEFAULT_HELD_OUT = 20_000, 4_000


@dataclass(frozen=True, kw_only=True)
class JobData:
    share: Share
    smallest: int  # rows of the smallest trainer's share: every trainer stops with it
    rows: int  # training rows of the whole job
    held_out: Optional[CtrData]
    standardize: Standardize  # of the dense features, the same in every trainer


def job_data(cfg: Any, index: int, trainers: int, held_out: bool) -> JobData:
    """Trainer ``index``'s share of the job's rows and, when asked, the held-out rows."""
    if from_files(cfg.data):
        return _files(cfg, index, trainers, held_out)
    return _synthetic(cfg, index, trainers, held_out)


def _synthetic(cfg: Any, index: int, trainers: int, held_out: bool) -> JobData:
    data, seed, buckets = cfg.data, cfg.trainer.seed, cfg.model.sparse_buckets
    rows = synthetic(data.num_samples or DEFAULT_ROWS, seed, buckets, cardinality=str(data.cardinality))
    standardize = Standardize.of(rows.rows(slice(0, STATS_ROWS)))
    held = data.val_samples or DEFAULT_HELD_OUT
    val = standardize(synthetic(held, seed, buckets, HELD_OUT, str(data.cardinality))) if held_out else None
    standardize(rows)
    return JobData(
        share=MemoryRows(data=rows.shard(index, trainers)),
        smallest=len(rows) // trainers,
        rows=len(rows),
        held_out=val,
        standardize=standardize,
    )


def _files(cfg: Any, index: int, trainers: int, held_out: bool) -> JobData:
    data, buckets = cfg.data, cfg.model.sparse_buckets
    parts = find_parts(data.path)
    total = parts[-1].first + parts[-1].lines
    tail = 0 if data.val_path else data.val_samples
    train = data.num_samples if data.num_samples is not None else total - tail
    if train <= 0 or train + tail > total:
        given = data.num_samples is not None
        most = total - tail if given else total - 1
        raise ConfigError(
            "data.num_samples" if given else "data.val_samples",
            data.num_samples if given else data.val_samples,
            (f"at most {most}: " if most > 0 else "fewer rows: ")
            + f"{data.path} holds {total} rows"
            + (f" and data.val_samples={tail} of them are held out" if given and tail else ""),
        )
    standardize = Standardize.of(read_head(parts, min(train, STATS_ROWS), buckets))
    all_shares: List = shares(parts, 0, train, trainers)
    share = FileRows(segments=tuple(all_shares[index]), buckets=buckets, standardize=standardize)
    val = None
    if held_out and data.val_samples:
        val_parts = find_parts(data.val_path, "data.val_path") if data.val_path else parts
        begin = 0 if data.val_path else train
        val = standardize(read_range(val_parts, begin, begin + data.val_samples, buckets))
    return JobData(
        share=share,
        smallest=min(sum(s.rows for s in segments) for segments in all_shares),
        rows=train,
        held_out=val,
        standardize=standardize,
    )
