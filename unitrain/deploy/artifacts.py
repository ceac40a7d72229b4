"""Exported models, framework-neutral: what an artifact is, where its manifest lives, and the
held-out data it is checked and judged on.

``python -m unitrain.export`` writes artifacts into an export directory together with
``export.json``, the manifest: the source checkpoint, the job's resolved config (so that the
held-out set can be rebuilt without the checkpoint) and, per artifact, its files, batch size and
the check it passed. ``python -m unitrain.infer`` reads the same manifest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from omegaconf import OmegaConf

from unitrain.config.schema import UnitrainConfig
from unitrain.data.datasets import DATASETS, SyntheticDataset, build_heldout_dataset
from unitrain.errors import UnitrainError
from unitrain.host.atomic import replace_text

MANIFEST = "export.json"


class ArtifactError(UnitrainError):
    """An artifact or export directory that cannot be used; nothing was changed."""


@dataclass(frozen=True)
class Artifact:
    """One exported model: ``framework`` wrote it in ``format``; ``batch`` None accepts any batch."""

    directory: Path
    name: str
    framework: str
    format: str
    files: Tuple[str, ...]
    batch: Optional[int]

    @property
    def path(self) -> Path:
        return self.directory / self.files[0]

    def accepts(self, batch: int) -> bool:
        return self.batch is None or self.batch == batch

    def describe(self) -> str:
        batch = "any batch" if self.batch is None else f"batch {self.batch}"
        return f"{self.name} ({self.framework} {self.format}, {batch})"


def stem(framework: str, batch: Optional[int]) -> str:
    """Artifact file stem, ``model.<framework>[.b<N>]``; the writer adds ``.pt2``, ``.json`` and
    ``.pdiparams``, or ``.onnx``. An artifact's name is its first file's name."""
    return f"model.{framework}" + (f".b{batch}" if batch else "")


def read_manifest(directory: Path) -> Dict[str, Any]:
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
        manifest["artifacts"]
    except FileNotFoundError:
        raise ArtifactError(
            f"{directory} holds no exported models ({MANIFEST} is missing); export one with: python -m "
            "unitrain.export <run dir> --format native,onnx"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ArtifactError(
            f"{path} is unreadable or incomplete ({type(err).__name__}: {err}); export again into a new --out directory"
        ) from None
    return manifest


def write_manifest(directory: Path, manifest: Dict[str, Any]) -> None:
    """Written beside and renamed into place: an interrupted export never leaves half a manifest."""
    replace_text(Path(directory) / MANIFEST, json.dumps(manifest, indent=2, default=str))


def artifacts_of(directory: Path, manifest: Dict[str, Any]) -> List[Artifact]:
    return [
        Artifact(Path(directory), name, e["framework"], e["format"], tuple(e["files"]), e.get("batch"))
        for name, e in sorted(manifest["artifacts"].items())
    ]


def locate(spec: str) -> Tuple[Path, List[Artifact]]:
    """The artifacts a command-line argument names: an export directory (all of them), a run
    directory (its ``export/``), or one artifact file listed in the manifest beside it."""
    path = Path(spec)
    if not path.exists():
        raise ArtifactError(
            f"{spec!r} does not exist; allowed: an export directory, a run directory with export/, or an exported "
            "model file"
        )
    if path.is_dir():
        directory = path if (path / MANIFEST).exists() or not (path / "export").is_dir() else path / "export"
        manifest = read_manifest(directory)
        found = artifacts_of(directory, manifest)
    else:
        directory = path.parent
        if not (directory / MANIFEST).exists():
            raise ArtifactError(
                f"{spec!r} is not a model unitrain exported: there is no {MANIFEST} beside it; allowed: a model file "
                "python -m unitrain.export wrote, in its export directory"
            )
        manifest = read_manifest(directory)
        found = [a for a in artifacts_of(directory, manifest) if path.name in a.files]
        if not found:
            raise ArtifactError(
                f"{spec!r} is not listed in {directory / MANIFEST}; allowed: a model that python -m unitrain.export "
                "wrote"
            )
    for artifact in found:
        missing = [f for f in artifact.files if not (directory / f).is_file()]
        if missing:
            raise ArtifactError(
                f"{artifact.name} is listed in {directory / MANIFEST} but {', '.join(missing)} is missing; export it "
                "again"
            )
    return directory, found


def job_config(config: Dict[str, Any]):
    """A checkpoint's resolved config on top of today's defaults (older checkpoints lack newer keys)."""
    return OmegaConf.merge(OmegaConf.structured(UnitrainConfig), config)


def held_out(cfg, samples: int) -> Tuple[Any, str]:
    """The job's held-out set and what it is. Synthetic jobs without one get ``samples`` from
    the held-out stream (disjoint from training); an image folder without ``val_path`` has no
    held-out images, so its training images are used and the description says so."""
    dataset = build_heldout_dataset(cfg.data, seed=cfg.trainer.seed)
    if dataset is not None:
        return dataset, f"held-out set of data={cfg.data.name} ({len(dataset)} samples)"
    cls = DATASETS.get(cfg.data.name)
    if issubclass(cls, SyntheticDataset):
        return cls(
            samples, cfg.data.image_size, cfg.data.num_classes, cfg.trainer.seed, 0.0, SyntheticDataset.HELD_OUT
        ), (f"{samples} samples from data={cfg.data.name}'s held-out stream")
    from unitrain.data.datasets import build_dataset

    dataset = build_dataset(cfg.data, default_size=samples, seed=cfg.trainer.seed)
    return dataset, f"TRAINING images of {cfg.data.path} (data.val_path is not set: no held-out images)"


def stack(dataset, indices) -> Tuple[np.ndarray, np.ndarray]:
    """Images (float32, NCHW) and labels of ``indices``, wrapping around a set smaller than asked."""
    samples = [dataset[int(i) % len(dataset)] for i in indices]
    return np.stack([s[0] for s in samples]).astype(np.float32), np.array([int(s[1]) for s in samples], dtype=np.int64)


def num_classes(cfg, dataset) -> int:
    """As the trainer decides it: the dataset's own count when it has one (folders, Fashion-MNIST)."""
    return int(getattr(dataset, "num_classes", cfg.data.num_classes))
