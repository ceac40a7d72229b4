"""What a finished run records in summary.json beyond its metrics: memory, the ranks' agreement,
the trace's top operators, skipped files, held-out results."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from unitrain.data.datasets import skipped_files
from unitrain.host.atomic import replace_text
from unitrain.host.memory import peak_rss_mb
from unitrain.interface.backend import Backend, Native
from unitrain.interface.distributed import DistributedContext
from unitrain.interface.profiler import Tracer
from unitrain.train.evaluation import Evaluator
from unitrain.train.tracing import load_events, operators_markdown, top_operators

log = logging.getLogger("unitrain")


def write(run_dir: Path, summary: Dict[str, Any]) -> None:
    """summary.json, written beside and renamed into place: a reader never sees half of it."""
    replace_text(Path(run_dir) / "summary.json", json.dumps(summary, indent=2) + "\n")


def peak_memory(backend: Backend, dist: DistributedContext) -> Dict[str, Any]:
    """Peak memory of every rank: host RSS, and the framework's device peak on accelerators."""
    host = peak_rss_mb()
    device = backend.peak_device_memory_mb(dist.device)
    own = np.zeros((2, dist.world_size))
    own[:, dist.rank] = host, device if device is not None else np.nan
    every = dist.all_reduce(own, "sum")
    return {
        "peak_host_rss_mb": [round(float(v), 1) for v in every[0]],
        "peak_device_mb": None if device is None else [round(float(v), 1) for v in every[1]],
    }


def ranks_in_sync(backend: Backend, dist: DistributedContext, model: Native, save_to: Optional[Path]) -> bool:
    """Whether every rank ended with bit-identical parameters (they must, in data parallel);
    with ``save_to``, each rank's parameters are written there as NumPy first."""
    arrays = backend.parameter_arrays(model)
    if save_to is not None:
        np.savez(save_to / f"final_weights.rank{dist.rank}.npz", **arrays)
    values = np.concatenate([a.ravel() for a in arrays.values()]).astype(np.float64)
    # Sums over the finite values plus counts of the others: NaN != NaN would make ranks that
    # diverged identically to NaN look out of sync.
    finite = values[np.isfinite(values)]
    fingerprint = np.array(
        [
            finite.sum(),
            (finite * finite).sum(),
            np.abs(finite).sum(),
            np.isnan(values).sum(),
            np.isposinf(values).sum(),
            np.isneginf(values).sum(),
        ]
    )
    # One collective: the max of (x, -x) gives every rank's largest and smallest value.
    extremes = dist.all_reduce(np.concatenate([fingerprint, -fingerprint]), "max")
    n = len(fingerprint)
    in_sync = bool(np.array_equal(extremes[:n], -extremes[n:]))
    if not in_sync:
        log.warning("parameters differ across ranks at the end of training")
    return in_sync


def trace_summary(
    tracer: Tracer, trace_file: Optional[Path], window: range, run_dir: Path, rank: int
) -> Optional[Dict[str, Any]]:
    """The trace file and its top operators by self time (also as top_ops.rank<r>.md); None
    when the step window was never reached."""
    if trace_file is None:
        log.warning(
            "profiler.mode=trace: the step window [%d, %d) was not reached, so no trace was written",
            window.start,
            window.stop,
        )
        return None
    rows = top_operators(load_events(trace_file), tracer.op_categories, tracer.normalize)
    (run_dir / f"top_ops.rank{rank}.md").write_text(operators_markdown(rows) + "\n")
    if rank == 0:
        log.info(
            "top operators by self time (rank 0, steps %d-%d):\n%s",
            window.start + 1,
            window.stop,
            operators_markdown(rows[:10]),
        )
    return {"file": Path(trace_file).name, "top_operators": rows}


def skipped(dataset: Any, evaluator: Optional[Evaluator]) -> Optional[Dict[str, Any]]:
    """Files data.skip_bad_files left out (training and held-out sets), for the record."""
    data = getattr(dataset, "dataset", dataset)  # under augmentation, the wrapped set
    files = skipped_files(data) + (skipped_files(evaluator.dataset) if evaluator else [])
    return {"count": len(files), "files": files[:20]} if files else None


#: A language model's held-out measures (unitrain.tasks.language).
TEXT_MEASURES = ("perplexity", "bits_per_character", "bits_per_byte")


def held_out(evaluations: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The last held-out result, and the evaluation time apart from training time (a resumed
    run's include the evaluations of the run it continues)."""
    if not evaluations:
        return None
    last = {k: evaluations[-1][k] for k in ("step", "val_loss", "val_top1", "val_top5", "val_samples")}
    # A language model's: its held-out loss under the name people look for, and what it means.
    text = {k: v for k, v in evaluations[-1].items() if k in TEXT_MEASURES}
    if text:
        text["loss"] = last["val_loss"]
    return {
        **last,
        **text,
        "evaluations": len(evaluations),
        "eval_s_total": sum(e.get("eval_s", 0.0) for e in evaluations),
    }
