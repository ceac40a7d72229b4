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

import errno
import json
import logging
import os
import re
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

import numpy as np

from unitrain.errors import Refusal, UnitrainError
from unitrain.interface.optim import optim_module
from unitrain.model.conversion import weights_for

log = logging.getLogger("unitrain")

FORMAT = 1


class CheckpointError(Refusal):
    """A checkpoint that cannot be used here; nothing was changed."""


def nonfinite(arrays: Dict[str, np.ndarray]) -> Optional[str]:
    """The name of the first array holding nan or inf, or None."""
    for name, array in arrays.items():
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            return name
    return None


def checkpoint_home(cfg: Any, run_dir: Path) -> Path:
    """Where a job's checkpoints/ folder is: dist.shared_dir (every node reaches it: a worker
    restarted on any node, every parameter server), or the run directory (node 0's)."""
    return Path(cfg.dist.shared_dir) if cfg.dist.shared_dir else Path(run_dir)


def still_latest(run_dir: Path) -> str:
    """What a run that writes no more checkpoints keeps, in words."""
    latest = Path(run_dir) / "checkpoints" / "latest"
    return (
        f"checkpoints/latest still names {latest.read_text().strip()}"
        if latest.is_file()
        else "no checkpoint was written"
    )


class CheckpointWriteError(CheckpointError):
    """A checkpoint that could not be written (a full disk, a lost permission): nothing half
    written is left, the latest checkpoint stays the latest, and the run stops."""

    exit_code = 1


def save_checkpoint(
    run_dir: Path,
    step: int,
    epoch: int,
    backend,
    arrays: Dict[str, np.ndarray],
    optimizer,
    precision,
    config: Dict[str, Any],
    model_record: Optional[Dict[str, Any]] = None,
) -> Path:
    """``arrays``: the model's state (``backend.state_arrays``), already checked to be finite;
    ``model_record``: what converts it later (:func:`unitrain.model.conversion.model_record`)."""
    root = Path(run_dir) / "checkpoints"
    final, tmp = root / f"step{step}", root / f".tmp-step{step}-{os.getpid()}"
    meta = {
        "format": FORMAT,
        "framework": backend.name,
        "model": config["model"]["name"],
        "step": step,
        "epoch": epoch,
        "time": time.time(),
        "config": config,
        **(model_record or {}),
    }
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        np.savez(tmp / "model.npz", **arrays)
        backend.save_training_state(tmp / "training_state", optimizer, {"precision": precision.state_dict()})
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    except Exception as err:  # noqa: BLE001 - the frameworks' savers raise anything a full disk makes them
        # Read before the partial checkpoint is removed, which frees what it had taken.
        free = shutil.disk_usage(root).free if root.is_dir() else None
        shutil.rmtree(tmp, ignore_errors=True)
        why = getattr(err, "strerror", None) or (str(err).strip().splitlines() or [type(err).__name__])[0]
        # torch.save says a full disk in its own words ("unexpected pos ..."): say it plainly.
        if getattr(err, "errno", None) == errno.ENOSPC or (
            free is not None and free < max(sum(a.nbytes for a in arrays.values()), 2**20)
        ):
            why = f"the disk is full ({(free or 0) // 1024} KiB free on the file system of {root})"
        raise CheckpointWriteError(
            f"the checkpoint of step {step} could not be written into {root}: {why}; {still_latest(run_dir)}"
        ) from None
    return publish(tmp, final)


def publish(tmp: Path, final: Path) -> Path:
    """A fully written checkpoint directory renamed into place, then ``latest`` pointed at it
    (also by rename): a crash in between leaves the earlier checkpoint the latest."""
    if final.exists():  # the same step saved again (a re-run into the same directory)
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = final.parent / f".latest-{os.getpid()}"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, final.parent / "latest")
    return final


def _resolve(path: Path) -> Path:
    """A checkpoint directory, or the latest one of a run directory or its checkpoints/ folder."""
    for folder in (path / "checkpoints", path):
        if (folder / "latest").is_file():
            return folder / (folder / "latest").read_text().strip()
    return path


def checkpoint_run_dir(path: Path) -> Path:
    """The run directory that wrote checkpoint ``path`` (``<run>/checkpoints/step<N>``)."""
    path = Path(path).resolve()
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


def _step_dirs(root: Path) -> List[Path]:
    found = [
        (int(m.group(1)), p) for p in root.glob("step*") if p.is_dir() and (m := re.fullmatch(r"step(\d+)", p.name))
    ]
    return [p for _, p in sorted(found)]


def clean_partial_checkpoints(run_dir: Path) -> None:
    """Remove what a write killed part-way left behind (hidden temporary directories and files):
    nothing refers to them, and each can be as large as a checkpoint."""
    root = Path(run_dir) / "checkpoints"
    leftovers = (
        [p for p in root.glob(".tmp-*")] + [p for p in root.glob(".latest-*")] + [p for p in root.glob(".old-*")]
    )
    for p in leftovers:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    if leftovers:
        log.info("removed %d partly written checkpoint(s) left in %s by an interrupted run", len(leftovers), root)


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints (0: all); the one ``latest`` names always stays.

    A checkpoint is renamed to a hidden name before it is deleted, so that a crash part-way
    never leaves a half-deleted directory that looks like a checkpoint."""
    root = Path(run_dir) / "checkpoints"
    if keep <= 0 or not root.is_dir():
        return
    latest = (root / "latest").read_text().strip() if (root / "latest").is_file() else None
    for old in _step_dirs(root)[:-keep]:
        if old.name == latest:
            continue
        doomed = root / f".old-{old.name}-{os.getpid()}"
        os.replace(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def find_checkpoint(
    spec: str,
    search: Iterable[Path],
    exclude: Path | None = None,
    key: str = "trainer.resume",
    fits: Optional[Dict[str, str]] = None,
) -> Path:
    """A checkpoint from a path (checkpoint or run directory) or ``latest``: the newest under
    ``search`` whose meta matches ``fits`` (framework and model), so that ``latest`` never
    picks a checkpoint this job cannot continue."""
    search = list(search)
    if spec != "latest":
        path = _resolve(Path(spec))
        if not (path / "meta.json").exists():
            raise CheckpointError(
                f"{key}={spec!r} is not a checkpoint: {path} has no meta.json; allowed: a checkpoint directory, "
                "a run directory with checkpoints/" + (", or latest" if search else "")
            )
        return path
    where = ", ".join(map(str, search)) or "(nowhere to look)"
    candidates = [
        f.parent / f.read_text().strip()
        for root in search
        if root.exists()
        for f in root.rglob("checkpoints/latest")
        if exclude is None or Path(exclude).resolve() not in f.resolve().parents
    ]
    candidates = [c for c in candidates if (c / "meta.json").exists()]
    if not candidates:
        raise CheckpointError(
            f"{key}=latest: no checkpoint under {where}; allowed: a checkpoint directory, a run directory, or latest"
        )
    fitting = [c for c in candidates if _meta_fits(c, fits)]
    if not fitting:
        wanted = ", ".join(f"{k}={v}" for k, v in (fits or {}).items())
        raise CheckpointError(
            f"{key}=latest: none of the {len(candidates)} checkpoint(s) under {where} fits {wanted}; "
            "name a checkpoint directory to resume another framework's checkpoint (its weights are converted)"
        )
    return max(fitting, key=lambda c: (c / "meta.json").stat().st_mtime)


def _meta_fits(path: Path, fits: Optional[Dict[str, str]]) -> bool:
    if not fits:
        return True
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return all(meta.get(k) == v for k, v in fits.items())


def read_meta(path: Path) -> Dict[str, Any]:
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path} is unreadable: meta.json: {err}") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {path} has format {meta.get('format')!r}; this unitrain reads format {FORMAT}"
        )
    return meta


#: meta.json's "kind" in a parameter-server job's checkpoint (unitrain/ps/checkpoint.py).
PS_KIND = "ps"


def read_image_meta(path: Path, command: str) -> Dict[str, Any]:
    """:func:`read_meta` of an image model's checkpoint, for ``command``; a parameter-server
    job's checkpoint is refused naming the commands that take it."""
    meta = read_meta(path)
    if meta.get("kind") == PS_KIND:
        raise CheckpointError(
            f"checkpoint {path} is a parameter-server job's (wide&deep): {command} takes the image models' "
            "checkpoints; a parameter-server run is exported for serving with python -m unitrain.export "
            f"{checkpoint_run_dir(path)}, and its export scores Criteo lines with python -m unitrain.infer <export "
            "directory> --criteo <file>"
        )
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
    if meta["model"] != model_name:
        raise CheckpointError(f"checkpoint {path} holds model={meta['model']}, not model={model_name}")
    arrays = read_model_arrays(path)
    broken = nonfinite(arrays)
    if broken:
        raise CheckpointError(
            f"checkpoint {path} holds weights that are not finite ({broken} has nan or inf); allowed: a checkpoint "
            "written before the training diverged"
        )
    foreign = meta["framework"] != backend.name
    if foreign:
        # unitrain.model.weights converts weights between the frameworks exactly; the optimizer's
        # buffers, the loss scaler and RNG states are in the writer's own format and do not.
        arrays = weights_for(arrays, meta, backend, model)
    try:
        backend.load_state_arrays(model, arrays)
    except UnitrainError as err:
        raise CheckpointError(f"checkpoint {path}: {err}") from None
    if foreign:
        log.warning(
            "checkpoint %s was written by %s: its weights were converted to %s exactly; its optimizer state "
            "(momentum, Adam's moments), loss scaler and RNG states do not carry across frameworks and start fresh",
            path,
            meta["framework"],
            backend.name,
        )
        return meta
    try:
        extra = backend.load_training_state(path / "training_state", optimizer)
    except UnitrainError:
        raise
    except Exception as err:  # noqa: BLE001 - framework loaders raise anything on a bad file
        raise CheckpointError(
            f"checkpoint {path} is corrupt or truncated: training_state: {type(err).__name__}: {err}"
        ) from None
    broken = optim_module(backend.name).nonfinite_state(optimizer)
    if broken:
        raise CheckpointError(
            f"checkpoint {path} holds an optimizer state that is not finite ({broken} has nan or inf); allowed: a "
            "checkpoint written before the training diverged"
        )
    precision.load_state_dict(extra.get("precision", {}))
    return meta
