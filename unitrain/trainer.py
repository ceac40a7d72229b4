"""The one training loop: framework-neutral, it drives any Backend through the interfaces."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Dict, List

from unitrain import __version__
from unitrain.backend import Backend
from unitrain.config import UnitrainConfig
from unitrain.data import build_dataset
from unitrain.errors import ConfigError
from unitrain.metrics import MetricsLog, topk_accuracy
from unitrain.profiler import Profiler
from unitrain.progress import StepProgress
from unitrain.sampler import DistributedBatchSampler
from unitrain.schedule import lr_at

log = logging.getLogger("unitrain")


class Trainer:
    """Runs ``cfg`` on ``backend`` and writes metrics.jsonl and summary.json into ``run_dir``."""

    def __init__(self, cfg: UnitrainConfig, backend: Backend, run_dir: str | Path, threads: int):
        self.cfg, self.backend, self.threads = cfg, backend, threads
        self.run_dir = Path(run_dir)

    def fit(self) -> Dict[str, Any]:
        cfg, backend = self.cfg, self.backend
        backend.set_threads(self.threads)
        backend.seed(cfg.trainer.seed)
        with backend.distributed(cfg.dist, cfg.backend.device) as dist:
            precision = backend.precision(cfg.amp)
            batch = cfg.trainer.batch_size
            steps = cfg.trainer.steps
            dataset = build_dataset(cfg.data, default_size=(steps or 1) * batch * dist.world_size, seed=cfg.trainer.seed)
            sampler = DistributedBatchSampler(
                len(dataset), batch, dist.world_size, dist.rank, cfg.data.shuffle, cfg.trainer.seed,
                cfg.data.drop_last, cfg.data.remainder, cfg.data.order,
            )  # fmt: skip
            if len(sampler) == 0:
                raise ConfigError(
                    "trainer.batch_size", batch,
                    f"at most {sampler.per_replica} (samples per process in a dataset of {len(dataset)}) "
                    "with data.drop_last=true; use a smaller batch or data.drop_last=false",
                )  # fmt: skip
            steps_per_epoch = min(steps or len(sampler), len(sampler))
            if steps and steps > len(sampler):
                log.warning("trainer.steps=%d but the data holds %d batches per epoch: running %d", steps, len(sampler), len(sampler))
            total_steps = steps_per_epoch * cfg.trainer.epochs
            num_classes = getattr(dataset, "num_classes", cfg.data.num_classes)

            model = backend.build_model(cfg.model.name, num_classes, dist.device, cfg.model.zero_init_residual)
            optimizer = backend.build_optimizer(model, cfg.optim)
            model, optimizer = precision.decorate(model, optimizer)
            model, optimizer = dist.wrap_model(model), dist.wrap_optimizer(optimizer)
            loader = backend.make_loader(dataset, sampler, cfg.data.num_workers, dist.device)

            profiler = Profiler(cfg.profiler.warmup_steps, enabled=cfg.profiler.mode != "off")
            metrics = MetricsLog(self.run_dir / "metrics.jsonl" if dist.is_main_process else None)
            progress = StepProgress(
                total_steps, f"{backend.name} {cfg.model.name}", dist.is_main_process and cfg.trainer.progress, cfg.trainer.log_every
            )
            log.info(
                "%s %s on %s, %d thread(s), %s, %d steps of batch %d",
                backend.package, backend.version(), dist.device, self.threads, precision.requested, total_steps, batch,
            )  # fmt: skip
            started = time.perf_counter()
            step = 0
            model.train()
            try:
                for epoch in range(cfg.trainer.epochs):
                    sampler.set_epoch(epoch)
                    for images, labels in profiler.timed(loader):
                        lr = lr_at(step, total_steps, cfg.optim)
                        backend.set_lr(optimizer, lr)
                        with precision.autocast():
                            logits = model(images)
                            loss = backend.loss(logits, labels)
                        precision.backward(loss)
                        precision.step(optimizer)
                        optimizer.zero_grad()
                        # Reading values back also waits for the device, so the step time is honest.
                        top1, top5 = topk_accuracy(backend.to_numpy(logits), backend.to_numpy(labels))
                        record = {"epoch": epoch, "step": step + 1, "loss": float(backend.to_numpy(loss)), "top1": top1, "top5": top5, "lr": lr}
                        timing = profiler.step(len(labels))
                        record.update(reader_cost=timing.reader_cost, batch_cost=timing.batch_cost, ips=timing.ips)
                        record.update(precision.metrics())
                        metrics.append(record)
                        step += 1
                        progress.update(step, record)
                        if step >= (epoch + 1) * steps_per_epoch:
                            break
            finally:
                progress.close()
                metrics.close()
            wall = time.perf_counter() - started

            summary = self._summary(dist, precision, metrics.records, metrics.final(), profiler, wall, num_classes, len(dataset))
            summary["num_parameters"] = backend.num_parameters(model)
            if dist.is_main_process:
                log.info("\n%s", profiler.format_summary())
                (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            return summary

    def _summary(self, dist, precision, records: List[dict], final: dict, profiler: Profiler, wall: float, num_classes: int, num_samples: int) -> Dict[str, Any]:
        cfg = self.cfg
        perf = profiler.summary()
        return {
            "unitrain_version": __version__,
            **self.backend.describe(),
            "device": dist.device,
            "world_size": dist.world_size,
            "seed": cfg.trainer.seed,
            "model": cfg.model.name,
            "data": cfg.data.name,
            "image_size": cfg.data.image_size,
            "num_classes": num_classes,
            "num_samples": num_samples,
            "batch_size": cfg.trainer.batch_size,
            "global_batch_size": cfg.trainer.batch_size * dist.world_size,
            "steps": len(records),
            "epochs": cfg.trainer.epochs,
            "precision": precision.describe(),
            "first_loss": records[0]["loss"] if records else None,
            "final": final,
            "throughput": {
                "samples_per_s": perf["ips"]["median"] if perf else None,
                "samples_per_s_min": perf["ips"]["min"] if perf else None,
                "samples_per_s_max": perf["ips"]["max"] if perf else None,
                "step_time_s": perf["batch_cost"]["median"] if perf else None,
            },
            "profiler": perf,
            "wall_time_s": wall,
        }
