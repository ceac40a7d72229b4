"""Serving a parameter-server job's wide&deep model: its export (``python -m unitrain.export``
on a parameter-server checkpoint) and the scoring of Criteo lines with it (``python -m
unitrain.infer <export dir> --criteo <file or folder>``).

An export directory holds ``vocabulary.npz`` (the ids the tables hold, their rows, the tower,
the dense features' standardization: :class:`unitrain.spec.serving.Serving`) and the models each
framework wrote, native and ONNX, which take the standardized dense features and each slot's
row. Every model is run by its deployment runtime and compared with the NumPy reference on
held-out rows (with ids the tables never held among them) before it is kept.
"""

from __future__ import annotations

import os
import shutil
import time
from itertools import islice
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from unitrain.data.criteo import CtrData, auc, log_loss, parse_numbered
from unitrain.data.criteo_files import find_parts, numbered_lines, shares
from unitrain.deploy import artifacts
from unitrain.errors import UnitrainError
from unitrain.host.machine import cpu
from unitrain.interface.serving import Predict, serving_module
from unitrain.ps.checkpoint import STANDARDIZE
from unitrain.ps.data import job_data
from unitrain.spec.serving import FILE, Serving

KIND = "ps"
STEM = "wide_deep"
CHECK_ROWS = 1000
TOLERANCE = 1e-5  # largest |probability difference| an export may have from the reference


def _serving(path: Path, meta: Dict[str, Any]) -> Serving:
    config = meta["config"]
    ids, rows, layers = serving_module(meta["framework"]).read_checkpoint(path, config)
    with np.load(path / STANDARDIZE) as standardize:
        mean, std = standardize["mean"], standardize["std"]
    return Serving.of(ids=ids, rows=rows, layers=layers, mean=mean, std=std, buckets=config["model"]["sparse_buckets"])


def _check_inputs(cfg: Any, serving: Serving) -> tuple:
    """Held-out rows of the job (its training rows when it held none out), their dense features
    standardized; every fifth slot's id replaced by one the tables never held."""
    data = job_data(cfg, 0, 1, held_out=True)
    rows = data.held_out if data.held_out is not None else next(iter(data.share.batches(CHECK_ROWS)))
    rows = rows.rows(slice(0, CHECK_ROWS))
    located = serving.locate(rows.sparse)
    located[:, ::5] = len(serving.ids)
    return rows.dense.astype(np.float32), located, rows


def run_onnx(path: Path, threads: int) -> Predict:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # its notes on unused initializers are not the user's business
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda dense, rows: session.run(None, {"dense": dense, "rows": rows})[0].reshape(-1)


def load(framework: str, fmt: str, files: List[Path], threads: int) -> Predict:
    return run_onnx(files[0], threads) if fmt == "onnx" else serving_module(framework).load_native(files, threads)


def _export_one(serving: Serving, framework: str, fmt: str, inputs: tuple, out: Path, tolerance: float) -> Dict:
    module = serving_module(framework)
    tmp = out / f".export-{STEM}-{framework}-{fmt}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        files = module.save(serving, tmp / f"{STEM}.{framework}", fmt)
        dense, rows, _ = inputs
        predict = load(framework, fmt, files, 1)
        diffs = [
            float(np.abs(serving.predict(dense[:n], rows[:n]) - predict(dense[:n], rows[:n])).max())
            for n in (1, len(dense))
        ]
        if max(diffs) > tolerance:
            raise UnitrainError(
                f"the {framework} {fmt} export differs from the checkpoint by {max(diffs):.3g} in a click probability "
                f"(allowed: {tolerance:g}); it was not kept"
            )
        for f in files:
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "framework": framework,
        "format": fmt,
        "files": [f.name for f in files],
        "batch": None,
        "writer": module.WRITERS[fmt],
        "checked_with": module.READERS[fmt],
        "max_abs_diff": max(diffs),
    }


def export_ps(
    path: Path, meta: Dict[str, Any], formats: List[str], targets: Optional[List[str]], out_dir: Path, tolerance: float
) -> Path:
    cfg = artifacts.job_config(meta["config"])
    serving = _serving(path, meta)
    inputs = _check_inputs(cfg, serving)
    out_dir.mkdir(parents=True, exist_ok=True)
    serving.save(out_dir)
    origin = {
        "checkpoint": str(path.resolve()),
        "framework": meta["framework"],
        "model": meta["model"],
        "step": meta["step"],
    }
    manifest = {"kind": KIND, "source": origin, "config": meta["config"], "vocabulary": FILE, "artifacts": {}}
    for framework in targets or [meta["framework"]]:
        for fmt in formats:
            entry = _export_one(serving, framework, fmt, inputs, out_dir, tolerance)
            manifest["artifacts"][entry["files"][0]] = entry
            manifest["cpu"] = cpu()
            artifacts.write_manifest(out_dir, manifest)
            print(
                f"{meta['framework']} wide_deep step {meta['step']} ({len(serving.ids):,} rows) -> "
                f"{out_dir / entry['files'][0]} ({entry['writer']}): checked with {entry['checked_with']} on "
                f"{len(inputs[0])} held-out rows: max |probability diff| {entry['max_abs_diff']:.2g}",
                flush=True,
            )
    return out_dir


# --- scoring ---------------------------------------------------------------------------------
def score(directory: Path, manifest: Dict[str, Any], criteo: str, batch: int, threads: int, out: Path) -> Dict:
    """Every exported model's click probabilities for the rows of ``criteo`` (read as a stream,
    ``batch`` rows at a time); the first model's are written to ``out`` (label, probability per
    line). Returns, per model, AUC and log loss over the rows, and its largest difference from
    the NumPy reference."""
    serving = Serving.load(directory)
    # Before the models: loading them imports both frameworks, seconds that a wrong path wastes.
    parts = find_parts(criteo, key="--criteo")
    models = {
        name: load(e["framework"], e["format"], [directory / f for f in e["files"]], threads)
        for name, e in sorted(manifest["artifacts"].items())
    }
    if not models:
        raise UnitrainError(f"{directory} holds no exported models; export one with: python -m unitrain.export <run>")
    lines = numbered_lines(shares(parts, 0, parts[-1].first + parts[-1].lines, 1)[0])
    labels, scores, diffs, started = [], {name: [] for name in models}, dict.fromkeys(models, 0.0), time.perf_counter()
    unknown = 0
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as written:
        while chunk := list(islice(lines, batch)):
            rows: CtrData = parse_numbered(chunk, serving.buckets)
            dense, located = serving.inputs(rows)
            unknown += int((located == len(serving.ids)).sum())
            reference = serving.predict(dense, located)
            for name, predict in models.items():
                got = np.asarray(predict(dense, located)).reshape(-1)
                diffs[name] = max(diffs[name], float(np.abs(got - reference).max()))
                scores[name].append(got)
            labels.append(rows.label)
            first = scores[next(iter(models))][-1]
            written.writelines(f"{int(y)}\t{p:.6f}\n" for y, p in zip(rows.label, first))
    os.replace(tmp, out)
    y = np.concatenate(labels)
    return {
        "rows": int(len(y)),
        # Ids the tables never held, which the models read as zero rows.
        "unknown_ids": unknown / max(len(y) * located.shape[1], 1),
        "seconds": time.perf_counter() - started,
        "scores": str(out),
        "models": {
            name: {
                "auc": auc(y, np.concatenate(s)),
                "logloss": log_loss(y, np.concatenate(s)),
                "max_abs_diff_from_reference": diffs[name],
            }
            for name, s in scores.items()
        },
    }
