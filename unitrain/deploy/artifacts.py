"""Exported models, framework-neutral: what an artifact is, where its manifest lives, and the
held-out data it is checked and judged on.

``python -m unitrain.export`` writes artifacts into an export directory together with
``export.json``, the manifest: the source checkpoint, the job's resolved config (so that the
held-out set can be rebuilt without the checkpoint), the input the artifacts take (``input``:
float32 images, or a language model's int64 token ids with a dynamic time axis) and, per
artifact, its files, batch size and the check it passed. ``python -m unitrain.infer`` reads the
same manifest. A language model's export holds the run's tokenizer (``tokenizer.json``) too:
what a deployment needs beside the model, and what the held-out token windows are re-read with.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from omegaconf import OmegaConf

from unitrain.config.schema import UnitrainConfig
from unitrain.data import text
from unitrain.data.datasets import DATASETS, SyntheticDataset, build_heldout_dataset
from unitrain.errors import ConfigError, UnitrainError
from unitrain.host.atomic import replace_text
from unitrain.train.language import context_length

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
    """The job's held-out set and what it is. Synthetic jobs without one get ``samples`` from
    the held-out stream (disjoint from training); an image folder without ``val_path`` has no
    held-out images, so its training images are used and the description says so. A language
    model's (data=text) are its corpus's held-out token windows, re-read with ``tokenizer`` (the
    run's ``tokenizer.json``), or seeded random ids in [0, ``vocab_size``) where they cannot be
    (:func:`text_held_out`)."""
    if is_text(cfg):
        return text_held_out(cfg, samples, tokenizer, vocab_size)
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
    """Inputs and labels of ``indices``, wrapping around a set smaller than asked: images as
    float32 (NCHW) with one label each, or token ids as int64 ``[batch, time]`` with the next
    token of every position as labels (``[batch, time]``)."""
    samples = [dataset[int(i) % len(dataset)] for i in indices]
    inputs = np.stack([s[0] for s in samples])
    labels = np.stack([np.asarray(s[1], dtype=np.int64) for s in samples])
    return (inputs if inputs.dtype.kind in "iu" else inputs.astype(np.float32)), labels


def num_classes(cfg, dataset) -> int:
    """As the trainer decides it: the dataset's own count when it has one (folders, Fashion-MNIST,
    a corpus's vocabulary)."""
    return int(getattr(dataset, "num_classes", cfg.data.num_classes))


# --- language models: token ids -------------------------------------------------------------
#: Where an export keeps the run's tokenizer, and the record of the corpus it was made from.
TOKENIZER_FILES = (text.TOKENIZER_FILE, text.record_path(Path(text.TOKENIZER_FILE)).name)


def is_text(cfg) -> bool:
    """Whether the job trained a language model on a corpus (data=text): token ids in."""
    return str(cfg.data.name) == "text"


def text_block_size(cfg) -> int:
    """The job's tokens per sample: data.block_size, else the built-in model's context length
    (a ``model=custom`` text job names data.block_size: preflight asks for it)."""
    context = context_length(str(cfg.model.name))
    return text.resolve_block_size(cfg.data, context, context)


class TokenIds(np.ndarray):
    """int64 token ids ``[batch, time]`` whose time axis an exporter keeps dynamic, from 1 to
    ``max_length`` tokens (the model's context): what a language model's example is. A plain
    array's shape is kept but for its batch, as for images."""

    max_length: int


def token_ids(ids: np.ndarray, max_length: int) -> TokenIds:
    example = np.ascontiguousarray(ids, dtype=np.int64).view(TokenIds)
    example.max_length = int(max_length)
    return example


@dataclass(frozen=True)
class RandomTokens:
    """Seeded token ids in [0, ``num_classes``), window i a pure function of (seed, i): the
    check data of a language model whose corpus cannot be read again."""

    samples: int
    block_size: int
    num_classes: int
    seed: int

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        window = np.random.default_rng([self.seed, index]).integers(0, self.num_classes, self.block_size + 1)
        return window[:-1].astype(np.int64), window[1:].astype(np.int64)


def corpus_config(cfg, tokenizer: Path) -> Any:
    """data=text's keys with the corpus found: data.path as the job gave it (relative to where it
    ran), else the absolute path the tokenizer's corpus record holds."""
    path = str(cfg.data.path)
    record = text.CorpusRecord.read(tokenizer)
    if not Path(path).exists() and record is not None and Path(record.corpus_path).exists():
        path = record.corpus_path
    keys = ("tokenizer", "vocab_size", "block_size", "val_fraction")
    return SimpleNamespace(path=path, **{k: cfg.data[k] for k in keys})


def text_held_out(cfg, samples: int, tokenizer: Optional[Path], vocab_size: Optional[int]) -> Tuple[Any, str]:
    """The corpus's held-out split as disjoint windows of the job's block size (every held-out
    token predicted once, as the trainer's evaluation does), tokenized by the run's own
    tokenizer; where the corpus is gone, changed, or the tokenizer is missing, ``samples`` windows
    of seeded random ids in [0, vocab_size), and the description says which and why."""
    block = text_block_size(cfg)
    vocab = int(vocab_size or cfg.data.vocab_size)
    if tokenizer is None or not Path(tokenizer).is_file():
        why = f"the run's tokenizer ({tokenizer or text.TOKENIZER_FILE}) is missing"
    else:
        data = corpus_config(cfg, Path(tokenizer))
        try:
            corpus = text.load_text(data, block_size=block, max_block_size=block, tokenizer_file=tokenizer)
        except ConfigError as err:
            why = f"the corpus cannot be read again ({err})"
        else:
            windows = corpus.held_out.with_stride(block)
            if corpus.vocab_size == vocab:
                return windows, (
                    f"held-out token windows of {data.path} ({len(windows)} windows of {block} tokens, the last "
                    f"{data.val_fraction:g} of the corpus, {corpus.tokenizer.kind} tokenizer of the run)"
                )
            why = f"the run's tokenizer has {corpus.vocab_size} tokens, the model {vocab}"
    return RandomTokens(samples, block, vocab, int(cfg.trainer.seed)), (
        f"random token ids in [0, {vocab}) ({samples} windows of {block} tokens, seeded): {why}"
    )


def input_entry(cfg, example: np.ndarray, vocab_size: int, tokenizer: Optional[str]) -> Dict[str, Any]:
    """The manifest's ``input``: what every artifact of the export takes, so that ``unitrain.infer``
    makes inputs without the job's code. None in a shape: a dynamic axis."""
    if not is_text(cfg):
        return {"kind": "images", "dtype": "float32", "shape": [None, *example.shape[1:]]}
    block = text_block_size(cfg)
    return {
        "kind": "tokens",
        "dtype": "int64",
        "shape": [None, None],
        "axes": ["batch", "time"],
        "max_length": block,
        "vocab_size": int(vocab_size),
        "tokenizer": tokenizer,
    }


def copy_tokenizer(source_dir: Path, out_dir: Path) -> Optional[str]:
    """The run's tokenizer (and its corpus record) into an export directory; its file name there,
    None where the run has none (its check data are then random ids)."""
    if not (Path(source_dir) / text.TOKENIZER_FILE).is_file():
        return None
    for name in TOKENIZER_FILES:
        if (Path(source_dir) / name).is_file() and not (Path(out_dir) / name).exists():
            shutil.copyfile(Path(source_dir) / name, Path(out_dir) / name)
    return text.TOKENIZER_FILE


def evaluation_data(manifest: Dict[str, Any], directory: Path, samples: int) -> Tuple[Any, str]:
    """The held-out data an export's artifacts are judged on, from its manifest: the job's
    held-out images, or its corpus's held-out token windows (the export's tokenizer)."""
    cfg = job_config(manifest["config"])
    entry = manifest.get("input") or {}
    tokenizer = Path(directory) / entry["tokenizer"] if entry.get("tokenizer") else None
    return held_out(cfg, samples, tokenizer, entry.get("vocab_size"))


def tokens_per_sample(manifest: Dict[str, Any]) -> Optional[int]:
    """A language model's tokens in each timed sample (its context length), None for images."""
    entry = manifest.get("input") or {}
    return int(entry["max_length"]) if entry.get("kind") == "tokens" else None
