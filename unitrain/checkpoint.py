"""Checkpoints: written atomically, read back exactly, refused clearly when they do not fit.

A checkpoint is a directory ``<run dir>/checkpoints/step<N>/`` holding
  model.npz         every parameter and buffer as NumPy, in the framework's own names;
  training_state    optimizer, loss scaler (and O2 master weights), RNG states, in the
                    framework's own format (torch.save / paddle.save);
  meta.json         framework, model, step, epoch and the resolved config.
It is written into a hidden temporary directory and renamed into place, then ``latest`` is
replaced (also by rename): a crash mid-write never leaves a half checkpoint as the latest.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, Iterable

import numpy as np

from unitrain.errors import UnitrainError

FORMAT = 1


class CheckpointError(UnitrainError):
    """A checkpoint that cannot be used here; nothing was changed."""


def save_checkpoint(run_dir: Path, step: int, epoch: int, backend, model, optimizer, precision, config: Dict[str, Any]) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / f"step{step}", root / f".tmp-step{step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    np.savez(tmp / "model.npz", **backend.state_arrays(model))
    backend.save_training_state(tmp / "training_state", optimizer, {"precision": precision.state_dict()})
    meta = {"format": FORMAT, "framework": backend.name, "model": config["model"]["name"], "step": step, "epoch": epoch, "time": time.time(), "config": config}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    if final.exists():  # the same step saved again (a re-run into the same directory)
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / f".latest-{os.getpid()}"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    return final


def _resolve(path: Path) -> Path:
    """A checkpoint directory, or the latest one of a run directory or its checkpoints/ folder."""
    for folder in (path / "checkpoints", path):
        if (folder / "latest").is_file():
            return folder / (folder / "latest").read_text().strip()
    return path


def find_checkpoint(spec: str, search: Iterable[Path], exclude: Path | None = None, key: str = "trainer.resume") -> Path:
    """A checkpoint from a path (checkpoint or run directory) or ``latest`` (newest under ``search``)."""
    if spec != "latest":
        path = _resolve(Path(spec))
        if not (path / "meta.json").exists():
            raise CheckpointError(
                f"{key}={spec!r} is not a checkpoint: {path} has no meta.json; allowed: a checkpoint directory, "
                "a run directory with checkpoints/" + (", or latest" if search else "")
            )
        return path
    candidates = [
        f.parent / f.read_text().strip()
        for root in search
        if root.exists()
        for f in root.rglob("checkpoints/latest")
        if exclude is None or exclude not in f.parents
    ]
    candidates = [c for c in candidates if (c / "meta.json").exists()]
    if not candidates:
        raise CheckpointError(f"trainer.resume=latest: no checkpoint under {', '.join(map(str, search))}; allowed: a checkpoint directory, a run directory, or latest")
    return max(candidates, key=lambda c: (c / "meta.json").stat().st_mtime)


def read_meta(path: Path) -> Dict[str, Any]:
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path} is unreadable: meta.json: {err}") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {meta.get('format')!r}; this unitrain reads format {FORMAT}")
    return meta


def read_model_arrays(path: Path) -> Dict[str, np.ndarray]:
    try:
        with np.load(path / "model.npz") as f:
            return {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated: model.npz: {err}") from None


def load_checkpoint(path: Path, backend, model_name: str, model, optimizer, precision) -> Dict[str, Any]:
    """Check that ``path`` fits, then restore model, optimizer, precision and RNG states."""
    meta = read_meta(path)
    if meta["framework"] != backend.name:
        raise CheckpointError(
            f"checkpoint {path} was written by {meta['framework']}, and backend={backend.name} cannot resume it; "
            f"python -m unitrain.convert {path} --to {backend.name} turns its weights into {backend.name}'s format"
        )
    if meta["model"] != model_name:
        raise CheckpointError(f"checkpoint {path} holds model={meta['model']}, not model={model_name}")
    arrays = read_model_arrays(path)
    try:
        backend.load_state_arrays(model, arrays)
    except UnitrainError as err:
        raise CheckpointError(f"checkpoint {path}: {err}") from None
    try:
        extra = backend.load_training_state(path / "training_state", optimizer)
    except UnitrainError:
        raise
    except Exception as err:  # noqa: BLE001 - framework loaders raise anything on a bad file
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated: training_state: {type(err).__name__}: {err}") from None
    precision.load_state_dict(extra.get("precision", {}))
    return meta
