"""Image classification: synthetic, learnable, imagefolder and Fashion-MNIST images, cross-entropy
over classes, held-out top-1 (maximized), samples/s. The shortest task: a new one starts here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from unitrain.data.datasets import DATASETS, SyntheticDataset, build_dataset, build_heldout_dataset, has_held_out
from unitrain.errors import ConfigError
from unitrain.tasks.language import refuse_language_model
from unitrain.tasks.task import ConversionProbe, Deployed, Measure, OnePrediction, OwnKey, TaskData

#: imagefolder reads the class sub-directories of data.path.
FOLDERS = "imagefolder"


class Images(OnePrediction):
    name = "images"
    # In the order the refusals list them (tests/test_tasks.py: the datasets' registry, all of it).
    datasets: Tuple[str, ...] = ("synthetic", "learnable", "imagefolder", "fashion_mnist")
    dist_mode = "collective"
    measure = Measure("val_top1", "held-out top-1", "maximize", target_max=1.0)
    rate_unit = "samples/s"
    val_samples_zero = "0: no held-out set"
    own_keys: Tuple[OwnKey, ...] = ()

    def check(self, cfg: Any) -> None:
        refuse_language_model(cfg)
        if cfg.data.name == FOLDERS and not cfg.data.path:
            raise ConfigError("data.path", cfg.data.path, "a directory of class sub-directories (data=imagefolder)")

    def check_files(self, cfg: Any) -> None:
        data = cfg.data
        if data.name != FOLDERS:
            return
        if not os.path.isdir(data.path):
            raise ConfigError("data.path", data.path, "an existing directory of class sub-directories")
        if data.val_path is not None and not os.path.isdir(data.val_path):
            raise ConfigError("data.val_path", data.val_path, "an existing directory of class sub-directories")

    def has_held_out(self, data: Any) -> bool:
        return has_held_out(data)

    def data(self, cfg: Any, run_dir: Path, resumed_run: Optional[Path], default_size: int) -> TaskData:
        train = build_dataset(cfg.data, default_size=default_size, seed=cfg.trainer.seed)
        return TaskData(train=train, held_out=build_heldout_dataset(cfg.data, seed=cfg.trainer.seed))

    def classes(self, data: Any) -> int:
        if data.name == FOLDERS:
            return sum(1 for entry in os.scandir(data.path) if entry.is_dir())
        count = getattr(DATASETS.get(data.name), "num_classes", None)
        return count if isinstance(count, int) else int(data.num_classes)

    def conversion_check(self, data: Any, num_classes: Optional[int]) -> ConversionProbe:
        classes = num_classes or data.num_classes or 10
        return ConversionProbe({"name": "synthetic", "image_size": data.image_size, "num_classes": classes}, 4)

    def evaluation_line(self, result: Mapping[str, float]) -> str:
        return (
            f"loss {result['val_loss']:.4f} top1 {result['val_top1']:.4f} top5 {result['val_top5']:.4f} "
            f"({int(result['val_samples'])} samples, {result['eval_s']:.2f} s)"
        )

    # --- the report
    input_kind = "images"
    deployed = Deployed("throughput_ips", "img/s", "images/s", "held-out top-1", "images")

    # --- export and inference
    def export_held_out(
        self, cfg: Any, samples: int, state: Optional[Path], vocab_size: Optional[int]
    ) -> Tuple[Any, str]:
        """The job's held-out images; a synthetic set without them: ``samples`` from its held-out
        stream (disjoint from training); an image folder without data.val_path: its training
        images, and the description says so."""
        dataset = build_heldout_dataset(cfg.data, seed=cfg.trainer.seed)
        if dataset is not None:
            return dataset, f"held-out set of data={cfg.data.name} ({len(dataset)} samples)"
        cls = DATASETS.get(cfg.data.name)
        if issubclass(cls, SyntheticDataset):
            data = cfg.data
            stream = cls(samples, data.image_size, data.num_classes, cfg.trainer.seed, 0.0, SyntheticDataset.HELD_OUT)
            return stream, f"{samples} samples from data={data.name}'s held-out stream"
        dataset = build_dataset(cfg.data, default_size=samples, seed=cfg.trainer.seed)
        return dataset, f"TRAINING images of {cfg.data.path} (data.val_path is not set: no held-out images)"

    def export_classes(self, cfg: Any, meta: Mapping[str, Any], held_out: Any) -> int:
        """As the trainer decides it: the dataset's own count where it has one (folders,
        Fashion-MNIST), else data.num_classes."""
        return int(getattr(held_out, "num_classes", cfg.data.num_classes))

    def input_entry(self, cfg: Any, example: Any, vocab_size: int, tokenizer: Optional[str]) -> Dict[str, Any]:
        return {"kind": self.input_kind, "dtype": "float32", "shape": [None, *example.shape[1:]]}

    def calibration_set(self, cfg: Any, state: Optional[Path], default_size: int) -> Any:
        return build_dataset(cfg.data, default_size=default_size, seed=cfg.trainer.seed)
