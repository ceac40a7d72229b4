"""Training-time augmentation in NumPy: a pure function of (seed, epoch, index).

Both frameworks, every rank and every loader worker compute the same augmented pixels for
the same sample of the same epoch. The epoch reaches the dataset inside the sample key
(``epoch * len(dataset) + index``), not as state set on the dataset: persistent loader
workers hold their own copy of the dataset and would never see a new epoch.
"""

from __future__ import annotations

from typing import Iterator, List

import numpy as np


def standard(image: np.ndarray, rng: np.random.Generator, pad: int = 4) -> np.ndarray:
    """Random crop of the image padded by ``pad`` pixels on each side, then a horizontal flip
    with probability 1/2 (the CIFAR/Fashion-MNIST recipe). Padding takes the value of each
    channel's border mean, so a normalised black background stays black."""
    c, h, w = image.shape
    fill = image[:, [0, -1], :].mean(axis=(1, 2)).reshape(c, 1, 1)
    padded = np.broadcast_to(fill, (c, h + 2 * pad, w + 2 * pad)).copy()
    padded[:, pad : pad + h, pad : pad + w] = image
    top, left = rng.integers(0, 2 * pad + 1, size=2)
    out = padded[:, top : top + h, left : left + w]
    if rng.random() < 0.5:
        out = out[:, :, ::-1]
    return np.ascontiguousarray(out)


def flip(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A horizontal flip with probability 1/2 and no crop: the lighter augmentation, for a
    schedule too short to fit the cropped images (Fashion-MNIST's garments are centred)."""
    return np.ascontiguousarray(image[:, :, ::-1]) if rng.random() < 0.5 else image


_TRANSFORMS = {"standard": standard, "flip": flip}
#: The names data.augment accepts: "none" leaves the dataset unwrapped.
AUGMENTATIONS = ("none", *_TRANSFORMS)


class AugmentedDataset:
    """``dataset`` with augmentation, indexed by ``epoch * len(dataset) + index``."""

    def __init__(self, dataset, seed: int, kind: str = "standard"):
        self.dataset, self.seed, self.transform = dataset, seed, _TRANSFORMS[kind]
        self.num_classes = getattr(dataset, "num_classes", None)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name):  # the wrapped set's samples, decode_error, skipped...
        if name == "dataset":  # not set yet while unpickling in a loader worker
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, key: int):
        epoch, index = divmod(int(key), len(self.dataset))
        image, label = self.dataset[index]
        # Stream 3: apart from the synthetic sets' sample (0), template (1) and held-out (2) streams.
        rng = np.random.default_rng((self.seed, 3, epoch, index))
        return self.transform(image, rng), label


class EpochKeyedBatches:
    """A batch sampler's batches with each index turned into the key AugmentedDataset reads."""

    def __init__(self, sampler, num_samples: int):
        self.sampler, self.num_samples = sampler, num_samples

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.sampler.set_epoch(epoch, start_batch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[List[int]]:
        offset = self.sampler.epoch * self.num_samples
        for batch in self.sampler:
            yield [offset + i for i in batch]

    def __getattr__(self, name):  # per_replica, batches_per_epoch, epoch...
        if name == "sampler":  # not set yet while unpickling in a loader worker
            raise AttributeError(name)
        return getattr(self.sampler, name)
