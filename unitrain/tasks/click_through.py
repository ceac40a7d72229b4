"""Click-through prediction (data=criteo, criteo_synthetic): Criteo-format rows, a wide&deep
model trained by parameter servers (dist.mode=ps, unitrain/ps/), its held-out AUC (maximized)
and log loss, examples/s. Its loop is the parameter-server job's, not the Trainer's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from unitrain.data import criteo_files
from unitrain.errors import ConfigError, UnitrainError
from unitrain.tasks.language import refuse_language_model
from unitrain.tasks.task import ConversionProbe, Deployed, Measure, OnePrediction, OwnKey, TaskData

#: Criteo's files (data.path, data.val_path); criteo_synthetic draws its rows from a seed.
FILES = "criteo"
SYNTHETIC = "criteo_synthetic"
_CARDINALITY = "small with data={data} (only criteo_synthetic draws its values)"


def from_files(data: Any) -> bool:
    """Whether the rows are read from Criteo files (data.path, data.val_path), not drawn."""
    return data.name == FILES


class ClickThrough(OnePrediction):
    name = "click_through"
    datasets: Tuple[str, ...] = (FILES, SYNTHETIC)
    dist_mode = "ps"
    measure = Measure("val_auc", "held-out AUC", "maximize", target_max=1.0)
    rate_unit = "examples/s"
    val_samples_zero = "0: no held-out set"
    own_keys: Tuple[OwnKey, ...] = (OwnKey("cardinality", "small", _CARDINALITY),)

    def check(self, cfg: Any) -> None:
        refuse_language_model(cfg)
        if cfg.data.name != SYNTHETIC:
            self.own_keys[0].check_unused(cfg.data)

    def check_files(self, cfg: Any) -> None:
        if not from_files(cfg.data):
            return
        for key, path in (("data.path", cfg.data.path), ("data.val_path", cfg.data.val_path)):
            if (path or key == "data.path") and not (path and os.path.exists(path)):
                raise ConfigError(key, path, f"{criteo_files.ALLOWED}, existing, with data=criteo")
            if path:
                criteo_files.check_source(path, key)

    def has_held_out(self, data: Any) -> bool:
        return True  # held-out rows: data.val_path, or the rows split off (unitrain/ps/data.py)

    def data(self, cfg: Any, run_dir: Path, resumed_run: Optional[Path], default_size: int) -> TaskData:
        raise UnitrainError(f"data={cfg.data.name} trains with dist.mode=ps (its parameter-server job reads its rows)")

    def classes(self, data: Any) -> int:
        return 2  # clicked or not

    def conversion_check(self, data: Any, num_classes: Optional[int]) -> ConversionProbe:
        raise UnitrainError(f"data={data.name}: its wide&deep model is unitrain's own (no conversion to check)")

    def evaluation_line(self, result: Mapping[str, float]) -> str:
        return f"AUC {result['val_auc']:.4f} log loss {result['val_logloss']:.4f}"

    def held_out_columns(self, summary: Mapping[str, Any]) -> Dict[str, Tuple[str, str]]:
        return {"held-out AUC": ("val_auc", ".4f"), "held-out log loss": ("val_logloss", ".4f")}

    # --- the report
    #: Criteo lines (its exports' manifests are of kind "ps", scored by unitrain.infer --criteo).
    input_kind = "rows"
    deployed = Deployed("throughput_ips", "examples/s", "examples/s", "held-out top-1", "examples")

    # --- export and inference
    #: Its export is the parameter-server checkpoint's (unitrain/deploy/ps_export.py), with its
    #: own manifest: what follows is never asked of a checkpoint of this task but refuses.

    def export_held_out(
        self, cfg: Any, samples: int, state: Optional[Path], vocab_size: Optional[int]
    ) -> Tuple[Any, str]:
        raise _exported_by_ps(cfg)

    def export_classes(self, cfg: Any, meta: Mapping[str, Any], held_out: Any) -> int:
        return self.classes(cfg.data)

    def input_entry(self, cfg: Any, example: Any, vocab_size: int, tokenizer: Optional[str]) -> Dict[str, Any]:
        raise _exported_by_ps(cfg)

    def calibration_set(self, cfg: Any, state: Optional[Path], default_size: int) -> Any:
        raise _exported_by_ps(cfg)


def _exported_by_ps(cfg: Any) -> UnitrainError:
    return UnitrainError(
        f"data={cfg.data.name} trains a wide&deep model with dist.mode=ps: python -m unitrain.export <run dir> "
        "exports its parameter-server checkpoint, whose export scores Criteo lines (python -m unitrain.infer "
        "<export directory> --criteo <file>)"
    )
