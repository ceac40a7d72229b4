"""Held-out evaluation, augmentation and Fashion-MNIST: what a user relies on to compare models."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import BACKENDS, FAST, run_unitrain
from unitrain.data.augment import AugmentedDataset, EpochKeyedBatches
from unitrain.data.datasets import LearnableDataset, SyntheticDataset
from unitrain.data.fashion_mnist import DEFAULT_PATH, available
from unitrain.data.sampler import DistributedBatchSampler
from unitrain.model.build import build_model
from unitrain.train.evaluation import HeldOutBatches

HAVE_FASHION_MNIST = available()
needs_fashion_mnist = pytest.mark.skipif(
    not HAVE_FASHION_MNIST,
    reason=f"Fashion-MNIST is not in {DEFAULT_PATH} (apt-get install dataset-fashion-mnist; make test does it as root)",
)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), world=st.integers(1, 5), batch=st.integers(1, 64))
def test_held_out_shards_count_every_sample_exactly_once(n, world, batch):
    seen = [i for rank in range(world) for b in HeldOutBatches(n, batch, world, rank) for i in b]
    assert sorted(seen) == list(range(n))


def test_held_out_synthetic_samples_are_disjoint_from_training_ones():
    train = LearnableDataset(64, image_size=8, num_classes=4, seed=3)
    held = LearnableDataset(64, image_size=8, num_classes=4, seed=3, stream=SyntheticDataset.HELD_OUT)
    assert not any(np.array_equal(train[i][0], held[j][0]) for i in range(64) for j in range(64))
    # Same distribution: the same class templates under fresh noise.
    assert np.array_equal(train.templates, held.templates)


@pytest.mark.parametrize("workers", [0, 2])
def test_augmented_batches_are_identical_on_both_frameworks(workers):
    import unitrain

    data = AugmentedDataset(LearnableDataset(40, image_size=12, num_classes=4, seed=5), seed=5)
    batches = {}
    for name in BACKENDS:
        backend = unitrain.get_backend(name)
        sampler = EpochKeyedBatches(DistributedBatchSampler(len(data), 8, seed=5), len(data))
        epochs = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            epochs.append([backend.to_numpy(images) for images, _ in backend.make_loader(data, sampler, workers)])
        batches[name] = epochs
    for a, b in zip(batches["paddle"], batches["torch"]):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # Augmentation depends on the epoch: the same samples look different the next epoch.
    assert not np.array_equal(np.concatenate(batches["torch"][0]), np.concatenate(batches["torch"][1]))


def test_flip_augmentation_mirrors_about_half_the_samples_and_never_crops():
    base = LearnableDataset(200, image_size=12, num_classes=4, seed=5)
    data = AugmentedDataset(base, seed=5, kind="flip")
    mirrored = 0
    for key in range(2 * len(base)):  # two epochs
        image, label = data[key]
        original, original_label = base[key % len(base)]
        assert label == original_label
        if not np.array_equal(image, original):
            assert np.array_equal(image, original[:, :, ::-1])
            mirrored += 1
    assert 150 <= mirrored <= 250  # of 400: about half, and a pure function of the key
    assert all(np.array_equal(data[k][0], data[k][0]) for k in range(10))


def test_evaluation_is_logged_and_timed_apart(unitrain_cli):
    result = unitrain_cli(*FAST, "trainer.steps=6", "trainer.eval_every=3", "data.val_samples=50")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in lines if "val_top1" in r]
    assert [r["step"] for r in evals] == [3, 6] and all(r["val_samples"] == 50 for r in evals)
    summary = result.summary()
    assert summary["eval"]["val_top1"] == evals[-1]["val_top1"] and summary["eval"]["evaluations"] == 2
    assert summary["steps"] == 6  # evaluations are not training steps


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_data_parallel_evaluation_equals_one_process(backend, tmp_path):
    """37 held-out samples over 2 ranks (19 + 18): each counted once, as one process counts them."""
    import unitrain
    from unitrain.config.schema import DataConfig
    from unitrain.data.datasets import build_heldout_dataset
    from unitrain.interface.distributed import DistributedContext
    from unitrain.train.checkpoint import read_model_arrays
    from unitrain.train.evaluation import Evaluator

    args = [
        f"backend={backend}",
        *FAST,
        "trainer.steps=4",
        "data.val_samples=37",
        "trainer.eval_batch_size=8",
        "trainer.checkpoint_every=4",
    ]
    result = run_unitrain([*args, "dist.nproc_per_node=2", "trainer.threads=1"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    distributed = result.summary()["eval"]
    assert distributed["val_samples"] == 37

    b = unitrain.get_backend(backend)
    model = build_model(b, "tiny", 10)
    b.load_state_arrays(model, read_model_arrays(result.run_dir / "checkpoints" / "step4"))
    held_out = build_heldout_dataset(
        DataConfig(name="learnable", image_size=16, val_samples=37), seed=result.summary()["seed"]
    )
    single = Evaluator(b, held_out, DistributedContext(), batch_size=37)(model, b.precision())
    assert single["val_samples"] == 37
    assert single["val_top1"] == distributed["val_top1"] and single["val_top5"] == distributed["val_top5"]
    assert single["val_loss"] == pytest.approx(distributed["val_loss"], rel=1e-6)


def test_missing_fashion_mnist_files_give_one_line(unitrain_cli, tmp_path):
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    result = unitrain_cli(*FAST, "data=fashion_mnist", f"data.path={empty}", "trainer.steps=2")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("unitrain: error:")]
    assert "apt-get install dataset-fashion-mnist" in line and "train-images-idx3-ubyte(.gz) is missing" in line


def test_truncated_idx_file_gives_one_line(unitrain_cli, tmp_path):
    folder = tmp_path / "fm"
    folder.mkdir()
    header = bytes([0, 0, 8, 3]) + np.array([100, 28, 28], ">i4").tobytes()
    with gzip.open(folder / "train-images-idx3-ubyte.gz", "wb") as f:
        f.write(header + bytes(1000))  # far fewer than 100 x 28 x 28 pixels
    with gzip.open(folder / "train-labels-idx1-ubyte.gz", "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + np.array([100], ">i4").tobytes() + bytes(100))
    result = unitrain_cli(*FAST, "data=fashion_mnist", f"data.path={folder}", "trainer.steps=2")
    assert (
        result.returncode == 2
        and "train-images-idx3-ubyte.gz is truncated" in result.stderr
        and "Traceback" not in result.stderr
    )


@needs_fashion_mnist
@pytest.mark.parametrize("backend", BACKENDS)
def test_short_fashion_mnist_run_learns_well_above_chance(backend, unitrain_cli):
    result = unitrain_cli(
        f"backend={backend}",
        *FAST,
        "data=fashion_mnist",
        "data.image_size=28",
        "data.num_samples=768",
        "data.val_samples=500",
        "trainer.batch_size=32",
        "trainer.steps=null",
        "trainer.epochs=2",
        "optim.lr=0.05",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    held_out = result.summary()["eval"]
    assert held_out["val_samples"] == 500
    assert held_out["val_top1"] > 0.45, held_out  # chance is 0.10
