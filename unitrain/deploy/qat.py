"""Quantization-aware training (method=qat): the checkpoint's weights fine-tuned with fake
quantization for ``qat.steps`` in unitrain's own training loop (``Trainer``: the job's data,
batch, optimizer and augmentation; its metrics.jsonl and summary.json go into ``qat/``), then
converted and saved by the framework's toolkit."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from omegaconf import OmegaConf

from unitrain.deploy.quantization import Quantization
from unitrain.interface.quantize import Saved
from unitrain.model.weights import Arrays
from unitrain.train.trainer import Trainer


def qat_job_config(q: Quantization) -> Any:
    """The training job of the checkpoint, as a short fine-tuning run: same data, batch, optimizer
    and augmentation; ``qat.steps`` steps in one process at ``qat.lr``, no checkpoints."""
    job, cfg = q.job, q.cfg
    qat = OmegaConf.merge(job, {})
    qat.backend.name = q.framework
    qat.amp.level = "O0"
    qat.trainer.update(
        steps=cfg.qat.steps,
        epochs=1,
        checkpoint_every=0,
        eval_every=0,
        resume=None,
        repeats=1,
        threads=q.threads,
        loggers=[],
    )
    qat.dist.nproc_per_node, qat.dist.nnodes = 1, 1
    qat.optim.update(
        lr=cfg.qat.lr if cfg.qat.lr is not None else job.optim.lr * 0.01, warmup_steps=0, schedule="constant"
    )
    qat.profiler.mode, qat.profiler.warmup_steps = "timer", 0  # a few steps: no timing is reported
    return qat


def quantization_aware_training(q: Quantization, weights: Arrays, int8_dir: Path) -> tuple[Saved, Dict[str, Any]]:
    """Fine-tunes the checkpoint's weights with fake quantization in unitrain's training loop,
    then converts and saves it; returns the files and what the loop recorded."""
    example = q.example
    prepared = []

    def prepare(model: Any) -> Any:
        q.backend.load_state_arrays(model, weights)
        prepared.append(q.toolkit.prepare_qat(model, example, q.reduce_range))
        return prepared[-1]

    run_dir = q.out_dir / "qat"
    run_dir.mkdir(parents=True, exist_ok=True)
    qat_cfg = qat_job_config(q)
    print(
        f"quantization-aware training in {q.framework}: {q.cfg.qat.steps} steps at lr {qat_cfg.optim.lr:g} ...",
        flush=True,
    )
    # A user's pair as the checkpoint records it (a translated half: the run's copy); else the config's.
    model = q.model() if q.meta.get("custom") else None
    summary = Trainer(qat_cfg, q.backend, run_dir, q.threads, prepare_model=prepare, model=model).fit()
    saved = q.toolkit.save_qat(prepared[0], int8_dir / q.stem, example, q.cfg.batches)
    final = summary.get("final") or {}
    record = {
        "steps": summary["steps"],
        "lr": qat_cfg.optim.lr,
        "final_loss": final.get("loss"),
        "held_out": summary.get("eval"),
        "run_dir": "qat",
    }
    return saved, record
