"""Framework-neutral datasets: deterministic NumPy samples and the imagefolder reader."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from unitrain.data.datasets import ImageFolderDataset, LearnableDataset, SyntheticDataset
from unitrain.errors import ConfigError


@pytest.mark.parametrize("cls", [SyntheticDataset, LearnableDataset])
def test_samples_are_a_pure_function_of_seed_and_index(cls):
    a, b = cls(50, image_size=8, num_classes=4, seed=1), cls(50, image_size=8, num_classes=4, seed=1)
    x1, y1 = a[17]
    a[3]  # reading other samples in between must not change sample 17
    x2, y2 = b[17]
    assert x1.shape == (3, 8, 8) and x1.dtype == np.float32 and y1.dtype == np.int64
    np.testing.assert_array_equal(x1, x2)
    assert y1 == y2 and 0 <= y1 < 4
    assert not np.array_equal(cls(50, 8, 4, seed=2)[17][0], x1)


def test_index_out_of_range():
    with pytest.raises(IndexError):
        SyntheticDataset(5)[5]


def test_learnable_images_carry_their_class_pattern():
    data = LearnableDataset(400, image_size=8, num_classes=4, seed=0)
    images = np.stack([data[i][0] for i in range(400)])
    labels = np.array([data[i][1] for i in range(400)])
    # The class mean recovers the template: a nearest-template classifier is far above chance.
    means = np.stack([images[labels == c].mean(0) for c in range(4)])
    predicted = np.argmin(((images[:, None] - means[None]) ** 2).sum(axis=(2, 3, 4)), axis=1)
    assert (predicted == labels).mean() > 0.9


def _write_images(root, classes, per_class, size=(20, 12)):
    rng = np.random.default_rng(0)
    for cls in classes:
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / cls / f"{i}.png")


def test_imagefolder_reads_classes_resizes_and_normalises(tmp_path):
    _write_images(tmp_path, ["cat", "dog", "emu"], 2)
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    data = ImageFolderDataset(str(tmp_path), image_size=16)
    assert data.classes == ["cat", "dog", "emu"] and data.num_classes == 3 and len(data) == 6
    image, label = data[3]
    assert image.shape == (3, 16, 16) and image.dtype == np.float32 and label == 1
    assert -3 < image.mean() < 3  # normalised, not 0..255


def test_imagefolder_missing_and_empty_paths_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="data.path"):
        ImageFolderDataset(str(tmp_path / "missing"))
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(ConfigError, match="none found"):
        ImageFolderDataset(str(tmp_path))
