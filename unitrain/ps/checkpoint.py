"""Checkpoints of a parameter-server job: the servers' tables with their rules' state, and the
dense tower with its optimizer, written as the collective mode's are (a hidden temporary
directory renamed into place, then ``latest``), and read back by every process on resume.

``<run dir>/checkpoints/step<N>/`` holds what the engine writes (``PsProgram.save_state``)
and ``meta.json`` (step, epoch, the steps of an epoch, the resolved config). Trainer 0 writes
it while the other trainers wait at a barrier, so it holds the job's state after step N.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
from omegaconf import OmegaConf

from unitrain.data.criteo_files import Standardize
from unitrain.interface.ps import PsProgram
from unitrain.train.checkpoint import (
    FORMAT,
    PS_KIND,
    CheckpointError,
    CheckpointWriteError,
    checkpoint_home,
    clean_partial_checkpoints,
    find_checkpoint,
    prune_checkpoints,
    publish,
    read_meta,
    still_latest,
)

#: Settings a resumed job must share with the checkpoint: they shape the tables, their state
#: and the data order.
MUST_MATCH = (
    "backend.name",
    "model.embedding_dim",
    "model.hidden_layers",
    "model.sparse_buckets",
    "optim.name",
    "trainer.batch_size",
    "dist.ps.trainers",
)


@dataclass(frozen=True, kw_only=True)
class Resumed:
    path: Path
    step: int


STANDARDIZE = "standardize.npz"


def save(
    run_dir: Path, cfg: Any, program: PsProgram, step: int, steps_per_epoch: int, standardize: Standardize
) -> Path:
    where = checkpoint_home(cfg, run_dir)
    root = where / "checkpoints"
    final, tmp = root / f"step{step}", root / f".tmp-step{step}-{os.getpid()}"
    meta = {
        "format": FORMAT,
        "kind": PS_KIND,
        "framework": cfg.backend.name,
        "model": cfg.model.name,
        "step": step,
        "epoch": step // steps_per_epoch,
        "steps_per_epoch": steps_per_epoch,
        "time": time.time(),
        "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
    }
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        program.save_state(tmp)
        # The dense features' shift and scale: a served model needs them to score raw rows.
        np.savez(tmp / STANDARDIZE, mean=standardize.mean, std=standardize.std)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    except Exception as err:  # noqa: BLE001 - the engines' savers raise anything a full disk makes them
        shutil.rmtree(tmp, ignore_errors=True)
        why = getattr(err, "strerror", None) or (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise CheckpointWriteError(
            f"the checkpoint of step {step} could not be written into {root}: {why}; {still_latest(where)}"
        ) from None
    publish(tmp, final)
    prune_checkpoints(where, cfg.trainer.keep_checkpoints)
    return final


def _setting(cfg: Any, key: str) -> Any:
    value = OmegaConf.select(cfg, key)
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    return value.value if isinstance(value, Enum) else value


def find(cfg: Any, run_dir: Path) -> Optional[Resumed]:
    """The checkpoint ``trainer.resume`` names, checked to fit this job; None without one."""
    spec = cfg.trainer.resume
    if not spec:
        return None
    where = checkpoint_home(cfg, run_dir)
    clean_partial_checkpoints(where)
    search = [Path.cwd() / "runs", Path.cwd() / "multirun", *([where] if cfg.dist.shared_dir else [])]
    path = find_checkpoint(spec, search, exclude=run_dir, fits={"framework": cfg.backend.name, "model": cfg.model.name})
    meta = read_meta(path)
    if meta.get("kind") != PS_KIND:
        raise CheckpointError(
            f"trainer.resume={spec!r}: {path} is a collective job's checkpoint; allowed: a parameter-server job's"
        )
    saved = OmegaConf.create(meta["config"])
    for key in MUST_MATCH:
        if _setting(saved, key) != _setting(cfg, key):
            raise CheckpointError(
                f"trainer.resume={spec!r}: {path} was written with {key}={_setting(saved, key)!r}, this job "
                f"has {_setting(cfg, key)!r}; allowed: a checkpoint of the same {key}"
            )
    return Resumed(path=path, step=int(meta["step"]))


def check_epoch(resumed: Resumed, steps_per_epoch: int, total: int) -> None:
    """The checkpoint's place in this job: the same steps an epoch, and steps left to take."""
    meta: Dict[str, Any] = read_meta(resumed.path)
    if resumed.step >= total:
        raise CheckpointError(
            f"trainer.resume: {resumed.path} is step {resumed.step}, and this job ends at step {total}: nothing is "
            "left to run; allowed: an earlier checkpoint, or more trainer.epochs"
        )
    if meta["steps_per_epoch"] != steps_per_epoch:
        raise CheckpointError(
            f"trainer.resume: {resumed.path} was written by a job of {meta['steps_per_epoch']} steps an epoch, this "
            f"one takes {steps_per_epoch} (other data or trainer.steps); allowed: the same data and steps"
        )
