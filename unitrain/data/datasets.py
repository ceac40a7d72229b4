"""Framework-neutral datasets: NumPy in, NumPy out, so both backends see identical samples.

Every sample is a pure function of (dataset seed, index): no hidden RNG state, so the same
index gives the same image in any process, worker or framework.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, List, Optional, Protocol, Tuple

import numpy as np

from unitrain.data.fashion_mnist import FashionMNISTDataset
from unitrain.errors import ConfigError
from unitrain.registry import Registry

Sample = Tuple[np.ndarray, np.int64]


class SampleSet(Protocol):
    """What the loaders and samplers need of a dataset: its length, and sample i as NumPy."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Sample: ...


# ImageNet statistics, as in the Paddle and torchvision reference transforms.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")


class SyntheticDataset:
    """Random images and labels, like the seed's RandomDataset: measures speed, learns nothing."""

    #: RNG streams: training samples, class templates, held-out samples (augmentation uses 3).
    TRAIN, TEMPLATES, HELD_OUT = 0, 1, 2

    def __init__(
        self,
        num_samples: int,
        image_size: int = 32,
        num_classes: int = 10,
        seed: int = 0,
        sample_delay_s: float = 0.0,
        stream: int = 0,
    ):
        self.num_samples, self.image_size, self.num_classes, self.seed = num_samples, image_size, num_classes, seed
        self.sample_delay_s, self.stream = sample_delay_s, stream

    def __len__(self) -> int:
        return self.num_samples

    def _rng(self, index: int) -> np.random.Generator:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} samples")
        if self.sample_delay_s:
            time.sleep(self.sample_delay_s)  # stands in for decoding a real image
        # Training samples, templates and held-out samples come from separate streams, so the
        # held-out set is disjoint from the training set yet from the same distribution.
        return np.random.default_rng((self.seed, self.stream, index))

    def __getitem__(self, index: int) -> Sample:
        rng = self._rng(index)
        image = rng.standard_normal((3, self.image_size, self.image_size), dtype=np.float32)
        label = np.int64(rng.integers(self.num_classes))
        return image, label


class LearnableDataset(SyntheticDataset):
    """Synthetic images carrying a class-dependent pattern under noise, so accuracy visibly rises."""

    # Pattern amplitude against unit-variance noise: learned within tens to hundreds of CPU steps, not at once.
    signal = 1.0

    def __init__(self, *args: Any, **kwargs: Any):  # SyntheticDataset's arguments
        super().__init__(*args, **kwargs)
        self.templates = np.random.default_rng((self.seed, self.TEMPLATES)).standard_normal(
            (self.num_classes, 3, self.image_size, self.image_size), dtype=np.float32
        )

    def __getitem__(self, index: int) -> Sample:
        rng = self._rng(index)
        label = index % self.num_classes
        noise = rng.standard_normal((3, self.image_size, self.image_size), dtype=np.float32)
        return noise + self.signal * self.templates[label], np.int64(label)


class BadImageError(ConfigError):
    """An image file that cannot be decoded."""

    def __init__(self, file: str, reason: str):
        super().__init__(
            "data.path", file, f"a decodable image; this one fails: {reason}; remove it or set data.skip_bad_files=true"
        )


class ImageFolderDataset:
    """A directory with one sub-directory of images per class, decoded and resized with Pillow.

    A file that does not decode never raises inside the frameworks' loaders (Paddle's reader
    thread dies and its main process waits forever; torch's worker processes wrap the error in
    pages of traceback): it comes out as a zero image with the label ``-1 - index``, and
    :class:`BadSampleGuard` turns that into one line naming the file, in the main process.
    With ``skip_bad_files`` every file is decoded once up front and the bad ones are left out,
    so that the sample order is the same in every process and on both frameworks."""

    #: Loaders over this dataset need a BadSampleGuard.
    may_yield_bad_samples = True

    def __init__(self, path: str, image_size: int = 224, skip_bad_files: bool = False, key: str = "data.path"):
        if not os.path.isdir(path):
            raise ConfigError(key, path, "an existing directory of class sub-directories")
        self.path, self.image_size = path, image_size
        self.classes = sorted(e.name for e in os.scandir(path) if e.is_dir())
        self.samples = [
            (os.path.join(path, cls, name), label)
            for label, cls in enumerate(self.classes)
            for name in sorted(os.listdir(os.path.join(path, cls)))
            if name.lower().endswith(IMAGE_EXTENSIONS)
        ]
        if not self.samples:
            raise ConfigError(
                key,
                path,
                f"a directory whose class sub-directories hold images ({', '.join(IMAGE_EXTENSIONS)}); none found",
            )
        if len(self.classes) < 2:
            raise ConfigError(
                key,
                path,
                f"at least 2 class sub-directories (a classifier needs two classes); it has {len(self.classes)}",
            )
        self.skipped: List[str] = []
        if skip_bad_files:
            good = [(f, label) for f, label in self.samples if self.decode_error(f) is None]
            self.skipped = sorted({f for f, _ in self.samples} - {f for f, _ in good})
            self.samples = good
            if self.skipped:
                logging.getLogger("unitrain").warning(
                    "data.skip_bad_files: left out %d file(s) that do not decode, e.g. %s",
                    len(self.skipped),
                    self.skipped[0],
                )
            if not self.samples:
                raise ConfigError(key, path, "at least one image that decodes; none does")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.samples)

    def _load(self, file: str) -> np.ndarray:
        from PIL import Image

        with Image.open(file) as img:
            img = img.convert("RGB").resize((self.image_size, self.image_size), Image.BILINEAR)
            return np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0

    def decode_error(self, file: str) -> Optional[str]:
        """Why ``file`` does not decode, or None when it does."""
        try:
            self._load(file)
        except (OSError, ValueError, SyntaxError) as err:  # PIL's UnidentifiedImageError is an OSError
            return f"{type(err).__name__}: {err}"
        return None

    def __getitem__(self, index: int) -> Sample:
        file, label = self.samples[index]
        try:
            array = self._load(file)
        except (OSError, ValueError, SyntaxError):
            return np.zeros((3, self.image_size, self.image_size), np.float32), np.int64(-1 - index)
        return (array - IMAGENET_MEAN) / IMAGENET_STD, np.int64(label)


class BadSampleGuard:
    """A framework loader over a dataset that marks undecodable samples with a negative label:
    the first such batch ends the run with one line naming the file."""

    def __init__(self, loader, dataset, to_numpy):
        self.loader, self.dataset, self.to_numpy = loader, dataset, to_numpy

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for images, labels in self.loader:
            values = self.to_numpy(labels).reshape(-1)
            if values.min() < 0:
                index = int(-1 - values[values < 0][0])
                file = self.dataset.samples[index][0]
                raise BadImageError(file, self.dataset.decode_error(file) or "it did not decode in a loader worker")
            yield images, labels


def guard(loader, dataset, backend):
    """``loader`` as is, or wrapped in a BadSampleGuard when ``dataset`` may yield bad samples."""
    return (
        BadSampleGuard(loader, dataset, backend.to_numpy)
        if getattr(dataset, "may_yield_bad_samples", False)
        else loader
    )


def skipped_files(dataset) -> List[str]:
    return list(getattr(dataset, "skipped", []))


DATASETS: Registry[type] = Registry("dataset")
DATASETS.register("synthetic", SyntheticDataset)
DATASETS.register("learnable", LearnableDataset)
DATASETS.register("imagefolder", ImageFolderDataset)
DATASETS.register("fashion_mnist", FashionMNISTDataset)


def build_dataset(cfg, default_size: int, seed: int):
    """The dataset a DataConfig describes; synthetic sets get ``default_size`` samples unless set."""
    cls = DATASETS.get(cfg.name)
    if cls is ImageFolderDataset:
        return ImageFolderDataset(cfg.path, cfg.image_size, cfg.skip_bad_files)
    if cls is FashionMNISTDataset:
        return FashionMNISTDataset(cfg.path, "train", cfg.image_size, cfg.num_samples)
    return cls(cfg.num_samples or default_size, cfg.image_size, cfg.num_classes, seed, cfg.sample_delay_s)


def has_held_out(cfg) -> bool:
    """Whether an image DataConfig has a held-out set (:func:`build_heldout_dataset` builds it)."""
    cls = DATASETS.get(cfg.name)
    if cls is FashionMNISTDataset:
        return True
    if cls is ImageFolderDataset:
        return bool(cfg.val_path)
    return bool(cfg.val_samples)


def build_heldout_dataset(cfg, seed: int):
    """The held-out set of a DataConfig, or None when it has none: Fashion-MNIST's 10,000 test
    images (the first ``val_samples`` if set), ``val_path`` for imagefolder, ``val_samples``
    samples from the held-out stream for the synthetic sets."""
    if not has_held_out(cfg):
        return None
    cls = DATASETS.get(cfg.name)
    if cls is FashionMNISTDataset:
        return FashionMNISTDataset(cfg.path, "test", cfg.image_size, cfg.val_samples or None)
    if cls is ImageFolderDataset:
        train_classes = sorted(e.name for e in os.scandir(cfg.path) if e.is_dir())
        held_out = ImageFolderDataset(cfg.val_path, cfg.image_size, cfg.skip_bad_files, key="data.val_path")
        if held_out.classes != train_classes:
            raise ConfigError(
                "data.val_path",
                cfg.val_path,
                f"a directory with the same class sub-directories as data.path ({', '.join(train_classes)})",
            )
        return held_out
    return cls(cfg.val_samples, cfg.image_size, cfg.num_classes, seed, 0.0, SyntheticDataset.HELD_OUT)
