"""Fashion-MNIST from its four IDX files, read with NumPy: the same pixels for both frameworks.

Debian's ``dataset-fashion-mnist`` package installs the files (gzip-compressed) into
``/usr/share/datasets/fashion-mnist/``; any directory holding the four files, compressed or
not, works too. The standard split: train on the 60,000, evaluate on the 10,000 test images.
"""

from __future__ import annotations

import gzip
import os
from typing import Dict, Tuple

import numpy as np

from unitrain.errors import ConfigError

DEFAULT_PATH = "/usr/share/datasets/fashion-mnist"
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
# Pixel statistics of the 60,000 training images (scaled to [0, 1]).
MEAN, STD = 0.2860, 0.3530
HOW_TO_GET = (
    "a directory holding the four Fashion-MNIST IDX files (apt-get install dataset-fashion-mnist puts them in "
    + DEFAULT_PATH
    + ")"
)


def available(path: str = DEFAULT_PATH) -> bool:
    """Whether ``path`` holds all four IDX files (gzipped, as the Debian package installs them)."""
    return all(os.path.exists(os.path.join(path, f + ".gz")) for pair in FILES.values() for f in pair)


def _open(folder: str, name: str):
    for candidate, opener in ((name + ".gz", gzip.open), (name, open)):
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            return path, opener(path, "rb")
    raise ConfigError("data.path", folder, f"{HOW_TO_GET}; {name}(.gz) is missing")


def read_idx(folder: str, name: str) -> np.ndarray:
    """An IDX array: 0, 0, type code (0x08: unsigned bytes), rank, big-endian int32 dimensions, data."""
    path, f = _open(folder, name)
    try:
        with f:
            data = f.read()
    except (OSError, EOFError) as err:
        raise ConfigError("data.path", folder, f"{HOW_TO_GET}; {os.path.basename(path)} is unreadable: {err}") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ConfigError(
            "data.path", folder, f"{HOW_TO_GET}; {os.path.basename(path)} is not an IDX file of unsigned bytes"
        )
    rank = data[3]
    dims = tuple(int(d) for d in np.frombuffer(data, ">i4", count=rank, offset=4))
    offset = 4 + 4 * rank
    if len(data) - offset != int(np.prod(dims)):
        raise ConfigError(
            "data.path",
            folder,
            f"{HOW_TO_GET}; {os.path.basename(path)} is truncated ({len(data) - offset} of {int(np.prod(dims))} bytes)",
        )
    return np.frombuffer(data, np.uint8, offset=offset).reshape(dims)


_CACHE: Dict[Tuple[str, str], Tuple[np.ndarray, np.ndarray]] = {}


def load_split(folder: str, split: str) -> Tuple[np.ndarray, np.ndarray]:
    """(images [N, 28, 28] uint8, labels [N] uint8) of ``split`` ("train" or "test")."""
    key = (os.path.abspath(folder), split)
    if key not in _CACHE:
        images_name, labels_name = FILES[split]
        images, labels = read_idx(folder, images_name), read_idx(folder, labels_name)
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ConfigError(
                "data.path",
                folder,
                f"{HOW_TO_GET}; {split} images {images.shape} and labels {labels.shape} do not match",
            )
        _CACHE[key] = images, labels
    return _CACHE[key]


class FashionMNISTDataset:
    """28x28 grayscale images, zero-padded (or resized) to ``image_size``, normalised with the
    dataset's mean and std, repeated to the 3 channels the ResNet stems take."""

    num_classes = len(CLASSES)

    def __init__(
        self, path: str | None = None, split: str = "train", image_size: int = 32, num_samples: int | None = None
    ):
        self.path, self.split, self.image_size = path or DEFAULT_PATH, split, image_size
        if not os.path.isdir(self.path):
            raise ConfigError("data.path", self.path, HOW_TO_GET)
        self.images, self.labels = load_split(self.path, split)
        if num_samples:
            self.images, self.labels = self.images[:num_samples], self.labels[:num_samples]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        pixels = self.images[index]
        size = self.image_size
        if size >= pixels.shape[0]:
            before = (size - pixels.shape[0]) // 2
            canvas = np.zeros((size, size), dtype=np.uint8)
            canvas[before : before + pixels.shape[0], before : before + pixels.shape[1]] = pixels
            pixels = canvas
        else:
            from PIL import Image

            pixels = np.asarray(Image.fromarray(pixels).resize((size, size), Image.BILINEAR))
        image = (pixels.astype(np.float32) / 255.0 - MEAN) / STD
        return np.repeat(image[None], 3, axis=0), np.int64(self.labels[index])
