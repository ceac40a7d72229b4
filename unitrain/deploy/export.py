"""``python -m unitrain.export <run dir | checkpoint | latest> --format native,onnx [--to torch,paddle]``

Writes deployable models from a checkpoint, in either framework's native format (torch.export
``.pt2``; Paddle inference program ``.json`` + ``.pdiparams``) and as ONNX (torch.onnx.export;
paddle2onnx), whichever framework trained it: weights convert exactly between the frameworks,
so one checkpoint gives four artifacts. Each artifact is checked as soon as it is written:
loaded back with its own runtime alone (torch.export.load, Paddle Inference, ONNX Runtime) and
its logits on held-out images compared with the checkpoint's model in inference mode. Only an
artifact that passes is moved into the export directory and listed in ``export.json``.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from unitrain.deploy import artifacts
from unitrain.interface.backend import capability, get_backend
from unitrain.train.checkpoint import checkpoint_run_dir, find_checkpoint, read_meta, read_model_arrays
from unitrain.errors import UnitrainError
from unitrain.host.machine import cpu
from unitrain.model.weights import convert

log = logging.getLogger("unitrain")

#: Held-out images the check runs on (dynamic-batch artifacts also at batch 1).
CHECK_SAMPLES = 8
#: Largest allowed |logit difference|, relative to the largest |logit| (at least 1): fp32
#: rounding only. Measured (AVX2 CPU; tiny, ResNet18 and ResNet50; both source frameworks; all
#: four artifacts): at most 3.4e-7. 1e-5 leaves room for other CPUs' kernels (README, "Export").
TOLERANCE = 1e-5


class ExportCheckError(UnitrainError):
    """An artifact whose outputs differ from the checkpoint's beyond the tolerance (not kept)."""


def reference(backend_name: str, arrays, model_name: str, classes: int, images: np.ndarray) -> np.ndarray:
    """Logits of the checkpoint's own model, in its own framework, in inference mode."""
    backend = get_backend(backend_name)
    model = backend.build_model(model_name, classes)
    backend.load_state_arrays(model, arrays)
    with capability(backend, "evaluation").inference(model):
        return np.asarray(backend.to_numpy(model(_tensor(backend_name, images))), dtype=np.float32)


def _tensor(framework: str, images: np.ndarray):
    if framework == "torch":
        import torch

        return torch.from_numpy(images)
    import paddle

    return paddle.to_tensor(images)


def run_artifact(framework: str, fmt: str, path: Path, images: np.ndarray) -> np.ndarray:
    """The artifact's logits, computed by its deployment runtime alone (no unitrain model code):
    the first runtime ``unitrain.infer`` lists for it (torch.export.load, the Paddle Inference
    predictor, ONNX Runtime), so the check and the benchmark load an artifact the same way."""
    from unitrain.deploy.runtimes import runtimes_for

    artifact = artifacts.Artifact(path.parent, path.name, framework, fmt, (path.name,), None)
    runtime = runtimes_for(artifact, threads=len(os.sched_getaffinity(0)))[0]
    runtime.load()
    return np.asarray(runtime.run(runtime.prepare(images)))


def compare_logits(ref: np.ndarray, got: np.ndarray) -> Dict[str, float]:
    return {
        "max_abs_diff": float(np.abs(ref - got).max()),
        "max_abs_logit": float(np.abs(ref).max()),
        "top1_agreement": float((ref.argmax(1) == got.argmax(1)).mean()),
    }


def export_one(
    source: Dict[str, Any], arrays, framework: str, fmt: str, batch: Optional[int], images: np.ndarray, out: Path, tolerance: float
) -> Dict[str, Any]:
    """Write, check and move one artifact into ``out``; returns its manifest entry."""
    backend = get_backend(framework)
    model = backend.build_model(source["model"], source["classes"])
    backend.load_state_arrays(model, convert(arrays, source["framework"], framework))
    stem = artifacts.stem(framework, batch)
    tmp = out / f".export-{stem}-{fmt}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        module = capability(backend, "export")
        started = time.perf_counter()
        write = module.save_onnx if fmt == "onnx" else module.save_native
        example = artifacts_tile(images, batch or len(images))
        files = write(model, tmp / stem, example, batch)
        export_s = time.perf_counter() - started
        checks = {}
        for size in ([1, len(images)] if batch is None else [batch]):
            x = artifacts_tile(images, size)
            ref = source["reference"](x)
            checks[size] = compare_logits(ref, run_artifact(framework, fmt, files[0], x))
        worst = max(c["max_abs_diff"] / max(1.0, c["max_abs_logit"]) for c in checks.values())
        agreement = min(c["top1_agreement"] for c in checks.values())
        entry = {
            "framework": framework, "format": fmt, "writer": artifacts.WRITERS[(framework, fmt)], "batch": batch,
            "files": [f.name for f in files], "bytes": sum(f.stat().st_size for f in files),
            "checked_with": artifacts.CHECKED_WITH[(framework, fmt)], "checked_batches": sorted(checks),
            "max_abs_diff": max(c["max_abs_diff"] for c in checks.values()), "relative_diff": worst,
            "top1_agreement": agreement, "tolerance": tolerance, "export_s": round(export_s, 3),
        }  # fmt: skip
        if worst > tolerance:
            raise ExportCheckError(
                f"{files[0].name} computes something else than the checkpoint: largest |logit difference| "
                f"{entry['max_abs_diff']:.3g} ({worst:.3g} of the largest logit, allowed {tolerance:g}), top-1 agreement "
                f"{agreement:.1%}; it was not kept"
            )
        for f in files:
            if (out / f.name).exists():
                raise UnitrainError(f"{out / f.name} already exists; allowed: a new --out directory, or remove it first")
        for f in files:
            os.replace(f, out / f.name)
        return entry
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def artifacts_tile(images: np.ndarray, size: int) -> np.ndarray:
    """``size`` images, repeating the check batch when it is smaller."""
    return np.ascontiguousarray(np.resize(images, (size, *images.shape[1:])) if size > len(images) else images[:size])






def export(spec: str, formats: List[str], targets: Optional[List[str]], batches: List[Optional[int]], out: Optional[str], tolerance: float = TOLERANCE) -> Path:
    path = find_checkpoint(spec, [Path.cwd() / "runs", Path.cwd() / "multirun"], key="checkpoint")
    meta = read_meta(path)
    cfg = artifacts.job_config(meta["config"])
    data, data_description = artifacts.held_out(cfg, CHECK_SAMPLES)
    images, _ = artifacts.stack(data, range(CHECK_SAMPLES))
    arrays = read_model_arrays(path)
    classes = artifacts.num_classes(cfg, data)
    out_dir = Path(out) if out else checkpoint_run_dir(path) / "export"
    if out_dir.exists() and not out_dir.is_dir():
        raise UnitrainError(f"--out={str(out_dir)!r} is not allowed: it is a file; allowed: a directory (created if missing)")
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = artifacts.read_manifest(out_dir) if (out_dir / artifacts.MANIFEST).exists() else None
    origin = {"checkpoint": str(path.resolve()), "framework": meta["framework"], "model": meta["model"], "step": meta["step"]}
    if manifest and manifest["source"]["checkpoint"] != origin["checkpoint"]:
        raise UnitrainError(f"{out_dir} holds models exported from {manifest['source']['checkpoint']}; allowed: a new --out directory for {path}")
    manifest = manifest or {"source": origin, "config": meta["config"], "check_data": data_description, "artifacts": {}}

    cache: Dict[int, np.ndarray] = {}

    def ref(x: np.ndarray) -> np.ndarray:
        key = len(x)
        if key not in cache:
            cache[key] = reference(meta["framework"], arrays, meta["model"], classes, x)
        return cache[key]

    source = {"framework": meta["framework"], "model": meta["model"], "classes": classes, "reference": ref}
    for framework in targets or [meta["framework"]]:
        for fmt in formats:
            for batch in batches:
                entry = export_one(source, arrays, framework, fmt, batch, images, out_dir, tolerance)
                entry["versions"] = {framework: get_backend(framework).version(), **_writer_versions(fmt)}
                manifest["artifacts"][entry["files"][0]] = entry
                manifest["cpu"] = cpu()
                artifacts.write_manifest(out_dir, manifest)
                print(
                    f"{meta['framework']} {meta['model']} step {meta['step']} -> {out_dir / entry['files'][0]} "
                    f"({entry['writer']}, {'any batch' if batch is None else f'batch {batch}'}): checked with {entry['checked_with']} "
                    f"on {data_description.split(' (')[0]}: max |logit diff| {entry['max_abs_diff']:.2g}, top-1 agreement {entry['top1_agreement']:.0%}",
                    flush=True,
                )  # fmt: skip
    return out_dir


def _writer_versions(fmt: str) -> Dict[str, str]:
    if fmt != "onnx":
        return {}
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("onnx", "onnxscript", "paddle2onnx", "onnxruntime"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found




