"""One quantize run, resolved (:mod:`unitrain.deploy.quantize` runs it): the checkpoint and its
training job, the toolkit that quantizes, the threads, and the data the toolkits read, as the
job's task gives them (``unitrain/tasks/``): calibration batches of its training set
(unaugmented, unlabeled; a language model's disjoint windows of its corpus's training split),
and the example they trace (the first calibration batch, else held-out data; a language model's
token ids carry their context length, so that the time axis stays dynamic)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from unitrain.config.schedule import BatchPlan
from unitrain.config.schema import QuantizeConfig
from unitrain.deploy import artifacts
from unitrain.errors import ConfigError
from unitrain.host.machine import cpu
from unitrain.interface.backend import Backend, get_backend
from unitrain.interface.quantize import QuantizeModule
from unitrain.model.conversion import checkpoint_model
from unitrain.model.custom import CustomModel
from unitrain.spec.models import ViTSpec
from unitrain.tasks import Task, task_of
from unitrain.train.checkpoint import checkpoint_run_dir


@dataclass(frozen=True, kw_only=True)
class Quantization:
    """One quantize run, resolved: the checkpoint, the toolkit that quantizes, its settings."""

    cfg: QuantizeConfig
    checkpoint: Path
    meta: Dict[str, Any]
    job: Any  # the checkpoint's training config
    task: Task
    framework: str
    backend: Backend
    toolkit: QuantizeModule
    #: Calibration batches; none for ``dynamic``, which calibrates nothing.
    calibration: List[np.ndarray]
    #: What the toolkits trace the model with: the first calibration batch, else held-out data
    #: (a language model's token ids carry their context length: the time axis stays dynamic).
    example: np.ndarray
    threads: int
    reduce_range: bool
    out_dir: Path

    def model(self) -> "str | ViTSpec | CustomModel":
        """The checkpoint's model, as build_model takes it (a translated half: its run's copy)."""
        return checkpoint_model(self.meta, checkpoint_run_dir(self.checkpoint))

    @property
    def classes(self) -> int:
        """The model's outputs as its task reads them (a language model's vocabulary: from the
        checkpoint, as the check data may be random ids)."""
        return self.task.export_classes(self.job, self.meta, artifacts.held_out(self.job, 8)[0])

    @property
    def samples(self) -> List[np.ndarray]:
        """What save_quantized reads: the calibration batches, or (dynamic) the example alone,
        traced and never observed for activation ranges."""
        return self.calibration or [self.example]

    @property
    def stem(self) -> str:
        return artifacts.stem(self.framework, None) + f".{self.cfg.method}"

    def settings(self) -> Dict[str, Any]:
        """How the artifacts were made, recorded beside each (``qat`` adds what training did)."""
        method = self.cfg.method
        return {
            "method": method,
            "calib_batches": len(self.calibration) if method != "dynamic" else 0,
            "calib_batch_size": self.cfg.calib_batch_size,
            "per_channel": self.cfg.per_channel,
            "reduce_range": self.reduce_range,
            **({"qat_steps": self.cfg.qat.steps} if method == "qat" else {}),
        }


def resolved(
    cfg: QuantizeConfig, path: Path, meta: Dict[str, Any], framework: str, toolkit: QuantizeModule, out_dir: Path
) -> Quantization:
    """The run on checkpoint ``path`` (``meta``) by ``toolkit``, its data read: the job's task
    gives the calibration batches (none for dynamic) and the example."""
    job = artifacts.job_config(meta["config"])
    task = task_of(job)
    # 7-bit activations where the CPU lacks VNNI: the AVX2 int8 dot product saturates otherwise.
    has_vnni = any("vnni" in e for e in cpu()["extensions"] or [])
    state = artifacts.run_state(task, checkpoint_run_dir(path))  # a language model's tokenizer
    calibration = (
        [] if cfg.method == "dynamic" else calibration_batches(job, cfg.calib_batches, cfg.calib_batch_size, state)
    )
    return Quantization(
        cfg=cfg,
        checkpoint=path,
        meta=meta,
        job=job,
        task=task,
        framework=framework,
        backend=get_backend(framework),
        toolkit=toolkit,
        calibration=calibration,
        example=_example(job, task, meta, calibration, state),
        threads=cfg.threads or len(os.sched_getaffinity(0)),
        reduce_range=cfg.reduce_range if cfg.reduce_range is not None else not has_vnni,
        out_dir=out_dir,
    )


def calibration_batches(
    job_cfg: Any, count: Optional[int], batch: int, tokenizer: Optional[Path] = None
) -> List[np.ndarray]:
    """The first ``count`` x ``batch`` training images, unaugmented and without labels, from the
    training set as the job built it (synthetic sets are sized by the job, not by the request);
    a language model's: disjoint windows of its corpus's training split, tokenized by the run's
    ``tokenizer``, as token ids whose time axis the toolkits keep dynamic."""
    task = task_of(job_cfg)
    plan = BatchPlan.from_config(job_cfg, job_cfg.dist.nproc_per_node * job_cfg.dist.nnodes)
    dataset = task.calibration_set(job_cfg, tokenizer, (job_cfg.trainer.steps or 1) * plan.global_batch)
    if count is None:
        count = min(32, max(1, len(dataset) // batch))
    if count * batch > len(dataset):
        raise ConfigError(
            "calib_batches",
            count,
            f"at most {len(dataset) // batch} batches of calib_batch_size={batch} (the training set holds "
            f"{len(dataset)} {task.deployed.sample_noun})",
        )
    batches = [artifacts.stack(dataset, range(i * batch, (i + 1) * batch))[0] for i in range(count)]
    return [task.export_example(job_cfg, b) for b in batches]


def _example(
    job: Any, task: Task, meta: Dict[str, Any], calibration: List[np.ndarray], state: Optional[Path]
) -> np.ndarray:
    """The batch the toolkits trace: the first calibration batch, else 8 held-out samples (more
    than one: torch.export would take a batch of 1 for a fixed size)."""
    if calibration:
        return calibration[0]
    data, _ = task.export_held_out(job, 8, state, meta.get("num_classes"))
    return task.export_example(job, artifacts.stack(data, range(8))[0])
