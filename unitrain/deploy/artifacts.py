"""Exported models, framework-neutral: what an artifact is, where its manifest lives, and the
held-out data it is checked and judged on.

``python -m unitrain.export`` writes artifacts into an export directory together with
``export.json``, the manifest: the source checkpoint, the job's resolved config (so that the
held-out set can be rebuilt without the checkpoint), the input the artifacts take (``input``:
float32 images, or a language model's int64 token ids with a dynamic time axis) and, per
artifact, its files, batch size and the check it passed. ``python -m unitrain.infer`` reads the
same manifest. A language model's export holds the run's tokenizer (``tokenizer.json``) too:
what a deployment needs beside the model, and what the held-out token windows are re-read with.
What an export takes, is checked on and carries is its job's task's to say (``unitrain/tasks/``:
``Task.export_held_out``, ``input_entry``, ``export_files``); this module only asks.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from omegaconf import OmegaConf

from unitrain.config.schema import UnitrainConfig
from unitrain.errors import UnitrainError
from unitrain.host.atomic import replace_text
from unitrain.tasks import Task, task_of
from unitrain.tasks.registry import task_of_inputs

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


def held_out(cfg, samples: int, tokenizer: Optional[Path] = None, vocab_size: Optional[int] = None) -> Tuple[Any, str]:
    """The job's held-out set and what it is, as its task gives it (``Task.export_held_out``):
    held-out images, a synthetic set's held-out stream, an image folder's training images (the
    description says so), or a language model's held-out token windows re-read with
    ``tokenizer`` (the run's ``tokenizer.json``), else seeded random ids in [0, ``vocab_size``)."""
    return task_of(cfg).export_held_out(cfg, samples, tokenizer, vocab_size)


def stack(dataset, indices) -> Tuple[np.ndarray, np.ndarray]:
    """Inputs and labels of ``indices``, wrapping around a set smaller than asked: images as
    float32 (NCHW) with one label each, or token ids as int64 ``[batch, time]`` with the next
    token of every position as labels (``[batch, time]``)."""
    samples = [dataset[int(i) % len(dataset)] for i in indices]
    inputs = np.stack([s[0] for s in samples])
    labels = np.stack([np.asarray(s[1], dtype=np.int64) for s in samples])
    return (inputs if inputs.dtype.kind in "iu" else inputs.astype(np.float32)), labels


def run_state(task: Task, run_dir: Path) -> Optional[Path]:
    """The file of a run its task's held-out data are re-read with (a language model's
    tokenizer: the first of ``Task.export_files``), None where the task keeps none."""
    return Path(run_dir) / task.export_files[0] if task.export_files else None


def carry_files(task: Task, source_dir: Path, out_dir: Path) -> Optional[str]:
    """The run's files its task's export carries (a language model's tokenizer and its corpus
    record) into an export directory; the first one's name there, None where the run has none
    (a language model's check data are then random ids)."""
    if not task.export_files or not (Path(source_dir) / task.export_files[0]).is_file():
        return None
    for name in task.export_files:
        if (Path(source_dir) / name).is_file() and not (Path(out_dir) / name).exists():
            shutil.copyfile(Path(source_dir) / name, Path(out_dir) / name)
    return task.export_files[0]


def input_task(manifest: Dict[str, Any]) -> Task:
    """The task whose models an export lists, by the kind of its manifest's ``input``; images'
    where it records none (an export older than the entry)."""
    return task_of_inputs([(manifest.get("input") or {}).get("kind")])


def evaluation_data(manifest: Dict[str, Any], directory: Path, samples: int) -> Tuple[Any, str]:
    """The held-out data an export's artifacts are judged on, from its manifest: the job's
    held-out images, or its corpus's held-out token windows (the export's tokenizer)."""
    cfg = job_config(manifest["config"])
    entry = manifest.get("input") or {}
    tokenizer = Path(directory) / entry["tokenizer"] if entry.get("tokenizer") else None
    return held_out(cfg, samples, tokenizer, entry.get("vocab_size"))


def tokens_per_sample(manifest: Dict[str, Any]) -> Optional[int]:
    """A language model's tokens in each timed sample (its context length), None for images."""
    return input_task(manifest).input_positions(manifest.get("input") or {})
