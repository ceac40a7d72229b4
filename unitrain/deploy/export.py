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
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from unitrain.deploy import artifacts, ps_export
from unitrain.deploy.export_check import (
    CHECK_SAMPLES,
    TOLERANCE,
    ExportCheckError,
    compare_logits,
    run_artifact,
    tile,
)
from unitrain.errors import UnitrainError, framework_cause
from unitrain.host import processes
from unitrain.host.machine import cpu
from unitrain.interface.backend import Backend, get_backend
from unitrain.interface.evaluation import evaluation_module
from unitrain.interface.export import ExportModule, export_module
from unitrain.model.build import build_model
from unitrain.model.conversion import checkpoint_model, weights_for
from unitrain.model.custom import CustomModel
from unitrain.model.weights import Arrays
from unitrain.tasks import Task, task_of
from unitrain.train.checkpoint import checkpoint_run_dir, find_checkpoint, read_meta, read_model_arrays


@dataclass(kw_only=True)
class Source:
    """The checkpoint: its weights, its job's task and config, and its own model's logits
    (computed once per batch size)."""

    framework: str
    model: "str | CustomModel"
    classes: int
    arrays: Arrays
    meta: Dict[str, Any]
    task: Task
    cfg: Any
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
        """What the exporter traces, as the task makes it: the inputs as they are (images), or
        token ids whose time axis it keeps dynamic up to the context length."""
        return self.task.export_example(self.cfg, inputs)

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


#: What a failed artifact's line offers instead: unitrain.export's own options (unitrain.quantize
#: gives its own, :func:`export`'s ``allowed``).
EXPORT_ALLOWED = "another --format or --to"
#: The folder an artifact is written and checked in before it is moved into the export directory.
_TMP = ".export-{stem}-{fmt}-{pid}"


def export_one(
    source: Source,
    target: Target,
    fmt: str,
    batch: Optional[int],
    images: np.ndarray,
    out: Path,
    tolerance: float,
    allowed: Callable[[str], str] = lambda fmt: EXPORT_ALLOWED,
) -> Dict[str, Any]:
    """Write, check and move one artifact into ``out``; returns its manifest entry. ``allowed``:
    what a failure's line offers instead, for the format that failed."""
    stem = artifacts.stem(target.framework, batch)
    remove_dead_tmp(out)
    tmp = out / _TMP.format(stem=stem, fmt=fmt, pid=os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        files, checks, export_s = _write_and_check(source, target, fmt, batch, images, tmp / stem, out, allowed(fmt))
        entry = _entry(source, target, fmt, batch, files, checks, export_s, tolerance)
        if entry["relative_diff"] > tolerance:
            raise ExportCheckError(
                f"{files[0].name} computes something else than the checkpoint: largest |logit difference| "
                f"{entry['max_abs_diff']:.3g} ({entry['relative_diff']:.3g} of the largest logit, allowed "
                f"{tolerance:g}), top-1 agreement {entry['top1_agreement']:.1%}; it was not kept"
            )
        _move_into(files, out)
        return entry
    except ExportCheckError as err:
        err.fmt = fmt
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_dead_tmp(out: Path) -> None:
    """The folders :func:`export_one` left in ``out`` from processes that are gone (killed before
    they could remove them)."""
    for folder in out.glob(".export-*-*"):
        pid = folder.name.rsplit("-", 1)[-1]
        if folder.is_dir() and pid.isdigit() and int(pid) != os.getpid() and not processes.running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _write_and_check(
    source: Source,
    target: Target,
    fmt: str,
    batch: Optional[int],
    images: np.ndarray,
    stem: Path,
    out: Path,
    allowed: str = EXPORT_ALLOWED,
) -> Tuple[List[Path], Dict[str, Dict[str, float]], float]:
    """The artifact's files written at ``stem`` by the target's exporter, its checks, and the
    seconds the writing took; a framework refusing is one line naming the step."""
    write = target.exporters.save_onnx if fmt == "onnx" else target.exporters.save_native
    started = time.perf_counter()
    step = f"writing the {target.framework} {fmt} artifact"
    try:
        files = write(target.model(source), stem, source.example(tile(images, batch or len(images))), batch)
        export_s = time.perf_counter() - started
        step = f"running the {target.framework} {fmt} artifact to check it"
        return files, _check(source, target, fmt, batch, images, files[0]), export_s
    except UnitrainError as err:
        if type(err) is not UnitrainError or "; allowed:" in str(err):
            raise
        # A writer's own line (paddle2onnx's missing operator): what to do instead added.
        raise UnitrainError(f"{err}; allowed: {allowed} (what was exported before it is kept in {out})") from None
    except MemoryError:
        raise
    except Exception as err:  # noqa: BLE001 - the framework's exporter or runtime refusing this model
        raise UnitrainError(
            f"{step} failed: {framework_cause(err)[:300]}; allowed: {allowed} (what was exported before it is "
            f"kept in {out})"
        ) from None


def _entry(
    source: Source,
    target: Target,
    fmt: str,
    batch: Optional[int],
    files: List[Path],
    checks: Dict[str, Dict[str, float]],
    export_s: float,
    tolerance: float,
) -> Dict[str, Any]:
    """The artifact's manifest entry: its files, how it was written and checked, and the worst
    of its checks (``relative_diff``: |logit difference| over the largest |logit|, at least 1)."""
    return {
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
        "relative_diff": max(c["max_abs_diff"] / max(1.0, c["max_abs_logit"]) for c in checks.values()),
        "top1_agreement": min(c["top1_agreement"] for c in checks.values()),
        "tolerance": tolerance,
        "export_s": round(export_s, 3),
    }


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


def _source(path: Path, meta: Dict[str, Any], cfg: Any, task: Task, data: Any) -> Source:
    return Source(
        framework=meta["framework"],
        model=checkpoint_model(meta, checkpoint_run_dir(path)),
        # A language model's vocabulary as its checkpoint records it (the check data may be random ids).
        classes=task.export_classes(cfg, meta, data),
        arrays=read_model_arrays(path),
        meta=meta,
        task=task,
        cfg=cfg,
        max_length=task.block_size(cfg),
    )


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
    allowed: Callable[[str], str] = lambda fmt: EXPORT_ALLOWED,
) -> Path:
    """The checkpoint ``spec`` exported in each format, framework and batch, each artifact checked;
    ``allowed``: what a failed artifact's line offers instead, for its format (unitrain.export's
    options by default)."""
    path = find_checkpoint(spec, [Path.cwd() / "runs", Path.cwd() / "multirun"], key="checkpoint")
    meta = read_meta(path)
    if meta.get("kind") == ps_export.KIND:
        return _export_ps(path, meta, formats, targets, batches, out, tolerance)
    cfg = artifacts.job_config(meta["config"])
    task, run_dir = task_of(cfg), checkpoint_run_dir(path)
    # A language model's held-out windows are re-read with the tokenizer of the run that trained it.
    state = artifacts.run_state(task, run_dir)
    data, data_description = task.export_held_out(cfg, CHECK_SAMPLES, state, meta.get("num_classes"))
    images, _ = artifacts.stack(data, range(CHECK_SAMPLES))
    source = _source(path, meta, cfg, task, data)
    origin = {
        "checkpoint": str(path.resolve()),
        "framework": meta["framework"],
        "model": meta["model"],
        "step": meta["step"],
    }
    out_dir = _export_dir(out, path, origin)
    # The tokenizer goes with the model: a deployment needs it, and unitrain.infer reads it.
    copied = artifacts.carry_files(task, run_dir, out_dir)
    inputs = task.input_entry(cfg, images, source.classes, copied)
    manifest = _manifest(out_dir, origin, meta, data_description, inputs)
    for framework in targets or [meta["framework"]]:
        target = Target.of(framework)
        for fmt in formats:
            for batch in batches:
                entry = export_one(source, target, fmt, batch, images, out_dir, tolerance, allowed)
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
