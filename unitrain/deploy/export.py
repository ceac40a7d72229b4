"""Deployable models from a checkpoint, each checked before it is kept.

Either framework's native format (torch.export ``.pt2``; Paddle inference program ``.json`` +
``.pdiparams``) and ONNX (torch.onnx.export; paddle2onnx), whichever framework trained the
checkpoint: weights convert exactly between the frameworks, so one checkpoint gives four
artifacts. Each artifact is checked as soon as it is written: loaded back with its own runtime
alone (torch.export.load, Paddle Inference, ONNX Runtime) and its logits on held-out images
compared with the checkpoint's model in inference mode. Only an artifact that passes is moved
into the export directory and listed in ``export.json``.

A language model (data=text) takes int64 token ids ``[batch, time]``: it is exported from an
example of its full context (block_size tokens) with the batch and the time axis dynamic (1 to
block_size tokens), and checked on held-out token windows at the full length and at half of it
(at batch 1 and N each), every position's logits against the checkpoint's model's.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from unitrain.data.text import tokenizer_path
from unitrain.deploy import artifacts, ps_export
from unitrain.deploy.runtimes import runtimes_for
from unitrain.errors import UnitrainError, framework_cause
from unitrain.host.machine import cpu
from unitrain.interface.backend import Backend, get_backend
from unitrain.interface.evaluation import evaluation_module
from unitrain.interface.export import ExportModule, export_module
from unitrain.model.build import build_model
from unitrain.model.conversion import checkpoint_model, weights_for
from unitrain.model.custom import CustomModel
from unitrain.model.weights import Arrays
from unitrain.train.checkpoint import checkpoint_run_dir, find_checkpoint, read_meta, read_model_arrays

#: Held-out images (or token windows) the check runs on (dynamic-batch artifacts also at batch 1).
CHECK_SAMPLES = 8
#: Largest allowed |logit difference|, relative to the largest |logit| (at least 1): fp32
#: rounding only, with room for other CPUs' kernels (docs/export-and-inference.md).
TOLERANCE = 1e-5


class ExportCheckError(UnitrainError):
    """An artifact whose outputs differ from the checkpoint's beyond the tolerance (not kept)."""


@dataclass(kw_only=True)
class Source:
    """The checkpoint: its weights, and its own model's logits (computed once per batch size)."""

    framework: str
    model: "str | CustomModel"
    classes: int
    arrays: Arrays
    meta: Dict[str, Any]
    #: A language model's context length: its time axis is dynamic up to it (None: images).
    max_length: Optional[int] = None
    _logits: Dict[tuple, np.ndarray] = field(default_factory=dict)
    _model: Any = None

    def reference(self, images: np.ndarray) -> np.ndarray:
        """Logits of the checkpoint's own model, in its own framework, in inference mode."""
        if images.shape not in self._logits:
            if self._model is None:
                backend = get_backend(self.framework)
                self._model = build_model(backend, self.model, self.classes)
                backend.load_state_arrays(self._model, self.arrays)
            predict = evaluation_module(self.framework).predict
            self._logits[images.shape] = np.asarray(predict(self._model, images), dtype=np.float32)
        return self._logits[images.shape]

    def example(self, inputs: np.ndarray) -> np.ndarray:
        """What the exporter traces: the inputs as they are (images), or token ids whose time
        axis it keeps dynamic up to the context length."""
        return inputs if self.max_length is None else artifacts.token_ids(inputs, self.max_length)

    def check_lengths(self) -> List[Optional[int]]:
        """The time lengths an artifact is checked at: the full context and half of it (None: images)."""
        return [None] if self.max_length is None else sorted({self.max_length, max(1, self.max_length // 2)})[::-1]


@dataclass(frozen=True, kw_only=True)
class Target:
    """A framework the checkpoint is exported for: its backend and exporters, resolved once."""

    framework: str
    backend: Backend
    exporters: ExportModule

    @classmethod
    def of(cls, framework: str) -> "Target":
        return cls(framework=framework, backend=get_backend(framework), exporters=export_module(framework))

    def model(self, source: Source) -> Any:
        """The checkpoint's model in this framework, its weights converted exactly."""
        model = build_model(self.backend, source.model, source.classes)
        self.backend.load_state_arrays(model, weights_for(source.arrays, source.meta, self.backend, model))
        return model


def run_artifact(framework: str, fmt: str, path: Path, inputs: List[np.ndarray]) -> List[np.ndarray]:
    """The artifact's logits for each of ``inputs``, computed by its deployment runtime alone (no
    unitrain model code), loaded once: the first runtime ``unitrain.infer`` lists for it
    (torch.export.load, the Paddle Inference predictor, ONNX Runtime), so the check and the
    benchmark load an artifact the same way."""
    artifact = artifacts.Artifact(path.parent, path.name, framework, fmt, (path.name,), None)
    runtime = runtimes_for(artifact, threads=len(os.sched_getaffinity(0)))[0]
    runtime.load()
    return [np.asarray(runtime.run(runtime.prepare(x))) for x in inputs]


def compare_logits(ref: np.ndarray, got: np.ndarray) -> Dict[str, float]:
    """Largest |difference| and the share of arg maxes that agree: per image, or per position of
    a language model's ``[batch, time, vocab]``."""
    if ref.shape != got.shape:
        raise ExportCheckError(
            f"the artifact gives logits of shape {list(got.shape)}, the checkpoint {list(ref.shape)}"
        )
    return {
        "max_abs_diff": float(np.abs(ref - got).max()),
        "max_abs_logit": float(np.abs(ref).max()),
        "top1_agreement": float((ref.argmax(-1) == got.argmax(-1)).mean()),
    }


def tile(images: np.ndarray, size: int) -> np.ndarray:
    """``size`` images, repeating the check batch when it is smaller."""
    return np.ascontiguousarray(np.resize(images, (size, *images.shape[1:])) if size > len(images) else images[:size])


def _check(
    source: Source, target: Target, fmt: str, batch: Optional[int], images: np.ndarray, file: Path
) -> Dict[str, Dict[str, float]]:
    """The artifact's logits against the checkpoint's, at its batch size (any batch: 1 and N) and,
    for a language model, at the full context and half of it; keyed ``"<batch>"`` or
    ``"<batch>x<length>"``."""
    shapes = [
        (size, length) for size in ([1, len(images)] if batch is None else [batch]) for length in source.check_lengths()
    ]
    inputs = [tile(images, size)[:, :length] if length else tile(images, size) for size, length in shapes]
    got = run_artifact(target.framework, fmt, file, inputs)
    return {
        str(size) + (f"x{length}" if length else ""): compare_logits(source.reference(x), y)
        for (size, length), x, y in zip(shapes, inputs, got)
    }


def export_one(
    source: Source, target: Target, fmt: str, batch: Optional[int], images: np.ndarray, out: Path, tolerance: float
) -> Dict[str, Any]:
    """Write, check and move one artifact into ``out``; returns its manifest entry."""
    stem = artifacts.stem(target.framework, batch)
    tmp = out / f".export-{stem}-{fmt}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write = target.exporters.save_onnx if fmt == "onnx" else target.exporters.save_native
        started = time.perf_counter()
        step = f"writing the {target.framework} {fmt} artifact"
        try:
            files = write(target.model(source), tmp / stem, source.example(tile(images, batch or len(images))), batch)
            export_s = time.perf_counter() - started
            step = f"running the {target.framework} {fmt} artifact to check it"
            checks = _check(source, target, fmt, batch, images, files[0])
        except (UnitrainError, MemoryError):
            raise
        except Exception as err:  # noqa: BLE001 - the framework's exporter or runtime refusing this model
            raise UnitrainError(
                f"{step} failed: {framework_cause(err)[:300]}; allowed: another --format or --to (what was "
                f"exported before it is kept in {out})"
            ) from None
        worst = max(c["max_abs_diff"] / max(1.0, c["max_abs_logit"]) for c in checks.values())
        agreement = min(c["top1_agreement"] for c in checks.values())
        entry = {
            "framework": target.framework,
            "format": fmt,
            "writer": target.exporters.WRITERS[fmt],
            "batch": batch,
            "files": [f.name for f in files],
            "bytes": sum(f.stat().st_size for f in files),
            "checked_with": target.exporters.CHECKED_WITH[fmt],
            "checked_batches": sorted({int(k.split("x")[0]) for k in checks}),
            **({"checked_lengths": source.check_lengths()} if source.max_length else {}),
            "max_abs_diff": max(c["max_abs_diff"] for c in checks.values()),
            "relative_diff": worst,
            "top1_agreement": agreement,
            "tolerance": tolerance,
            "export_s": round(export_s, 3),
        }
        if worst > tolerance:
            raise ExportCheckError(
                f"{files[0].name} computes something else than the checkpoint: largest |logit difference| "
                f"{entry['max_abs_diff']:.3g} ({worst:.3g} of the largest logit, allowed {tolerance:g}), top-1 "
                "agreement "
                f"{agreement:.1%}; it was not kept"
            )
        _move_into(files, out)
        return entry
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move_into(files: List[Path], out: Path) -> None:
    for f in files:
        if (out / f.name).exists():
            raise UnitrainError(f"{out / f.name} already exists; allowed: a new --out directory, or remove it first")
    for f in files:
        os.replace(f, out / f.name)


def _export_dir(out: Optional[str], checkpoint: Path, origin: Dict[str, Any]) -> Path:
    out_dir = Path(out) if out else checkpoint_run_dir(checkpoint) / "export"
    if out_dir.exists() and not out_dir.is_dir():
        raise UnitrainError(
            f"--out={str(out_dir)!r} is not allowed: it is a file; allowed: a directory (created if missing)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / artifacts.MANIFEST).exists():
        earlier = artifacts.read_manifest(out_dir)["source"]["checkpoint"]
        if earlier != origin["checkpoint"]:
            raise UnitrainError(
                f"{out_dir} holds models exported from {earlier}; allowed: a new --out directory for {checkpoint}"
            )
    return out_dir


def _export_ps(
    path: Path,
    meta: Dict[str, Any],
    formats: List[str],
    targets: Optional[List[str]],
    batches: List[Optional[int]],
    out: Optional[str],
    tolerance: float,
) -> Path:
    if batches != [None]:
        raise UnitrainError("--batch is not allowed for a parameter-server model: its exports take any batch size")
    origin = {"checkpoint": str(path.resolve())}
    return ps_export.export_ps(path, meta, formats, targets, _export_dir(out, path, origin), tolerance)


def _source(path: Path, meta: Dict[str, Any], cfg: Any, data: Any) -> Source:
    return Source(
        framework=meta["framework"],
        model=checkpoint_model(meta, checkpoint_run_dir(path)),
        classes=_classes(meta, cfg, data),
        arrays=read_model_arrays(path),
        meta=meta,
        max_length=artifacts.text_block_size(cfg) if artifacts.is_text(cfg) else None,
    )


def _classes(meta: Dict[str, Any], cfg: Any, data: Any) -> int:
    """The model's outputs: a language model's vocabulary as its checkpoint records it (the check
    data may be random ids), else as the trainer decided it."""
    if artifacts.is_text(cfg) and meta.get("num_classes"):
        return int(meta["num_classes"])
    return artifacts.num_classes(cfg, data)


def _manifest(
    out_dir: Path, origin: Dict[str, Any], meta: Dict[str, Any], data_description: str, inputs: Dict[str, Any]
) -> Dict[str, Any]:
    """The directory's manifest so far: exports into it add to what it already lists."""
    if (out_dir / artifacts.MANIFEST).exists():
        return artifacts.read_manifest(out_dir)
    return {
        "source": origin,
        "config": meta["config"],
        "check_data": data_description,
        "input": inputs,
        "artifacts": {},
    }


def _record(out_dir: Path, manifest: Dict[str, Any], entry: Dict[str, Any], target: Target, fmt: str) -> None:
    # Written after every artifact, so that an export stopped halfway still lists what it kept.
    entry["versions"] = {target.framework: target.backend.version(), **_writer_versions(fmt)}
    manifest["artifacts"][entry["files"][0]] = entry
    manifest["cpu"] = cpu()
    artifacts.write_manifest(out_dir, manifest)


def _announce(
    meta: Dict[str, Any], out_dir: Path, entry: Dict[str, Any], batch: Optional[int], data_description: str
) -> None:
    where = data_description.split(" (")[0]
    lengths = entry.get("checked_lengths")
    at = f" at {' and '.join(map(str, lengths))} tokens" if lengths else ""
    print(
        f"{meta['framework']} {meta['model']} step {meta['step']} -> {out_dir / entry['files'][0]} "
        f"({entry['writer']}, {'any batch' if batch is None else f'batch {batch}'}): checked with "
        f"{entry['checked_with']} on {where}{at}: max |logit diff| {entry['max_abs_diff']:.2g}, "
        f"top-1 agreement {entry['top1_agreement']:.0%}",
        flush=True,
    )


def export(
    spec: str,
    formats: List[str],
    targets: Optional[List[str]],
    batches: List[Optional[int]],
    out: Optional[str],
    tolerance: float = TOLERANCE,
) -> Path:
    path = find_checkpoint(spec, [Path.cwd() / "runs", Path.cwd() / "multirun"], key="checkpoint")
    meta = read_meta(path)
    if meta.get("kind") == ps_export.KIND:
        return _export_ps(path, meta, formats, targets, batches, out, tolerance)
    cfg = artifacts.job_config(meta["config"])
    text = artifacts.is_text(cfg)
    # A language model's held-out windows are re-read with the tokenizer of the run that trained it.
    tokenizer = tokenizer_path(checkpoint_run_dir(path)) if text else None
    data, data_description = artifacts.held_out(cfg, CHECK_SAMPLES, tokenizer, meta.get("num_classes"))
    images, _ = artifacts.stack(data, range(CHECK_SAMPLES))
    source = _source(path, meta, cfg, data)
    origin = {
        "checkpoint": str(path.resolve()),
        "framework": meta["framework"],
        "model": meta["model"],
        "step": meta["step"],
    }
    out_dir = _export_dir(out, path, origin)
    # The tokenizer goes with the model: a deployment needs it, and unitrain.infer reads it.
    copied = artifacts.copy_tokenizer(checkpoint_run_dir(path), out_dir) if text else None
    inputs = artifacts.input_entry(cfg, images, source.classes, copied)
    manifest = _manifest(out_dir, origin, meta, data_description, inputs)
    for framework in targets or [meta["framework"]]:
        target = Target.of(framework)
        for fmt in formats:
            for batch in batches:
                entry = export_one(source, target, fmt, batch, images, out_dir, tolerance)
                _record(out_dir, manifest, entry, target, fmt)
                _announce(meta, out_dir, entry, batch, data_description)
    return out_dir


def _writer_versions(fmt: str) -> Dict[str, str]:
    if fmt != "onnx":
        return {}
    found = {}
    for package in ("onnx", "onnxscript", "paddle2onnx", "onnxruntime"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found
