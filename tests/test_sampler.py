"""The framework-neutral sampler: the index stream both frameworks consume."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unitrain.data.sampler import DistributedBatchSampler

layouts = st.fixed_dictionaries(
    {
        "num_samples": st.integers(1, 300),
        "batch_size": st.integers(1, 32),
        "num_replicas": st.integers(1, 8),
        "seed": st.integers(0, 2**31),
        "remainder": st.sampled_from(["pad", "drop"]),
        "order": st.sampled_from(["global", "shard"]),
        "drop_last": st.booleans(),
    }
)


def ranks(layout: dict, epoch: int = 0):
    samplers = [DistributedBatchSampler(rank=r, **layout) for r in range(layout["num_replicas"])]
    for s in samplers:
        s.set_epoch(epoch)
    return samplers


def test_single_replica_visits_every_index_once_per_epoch():
    sampler = DistributedBatchSampler(103, 10, drop_last=False, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 11
    assert sorted(i for b in batches for i in b) == list(range(103))
    assert all(isinstance(i, int) for i in batches[0])


def test_drop_last_drops_the_short_batch():
    sampler = DistributedBatchSampler(103, 10, drop_last=True)
    assert len(sampler) == 10 == len(list(sampler))
    assert all(len(b) == 10 for b in sampler)


def test_no_shuffle_keeps_dataset_order():
    assert list(DistributedBatchSampler(6, 4, shuffle=False)) == [[0, 1, 2, 3], [4, 5]]


@settings(max_examples=150, deadline=None)
@given(layouts)
def test_every_index_appears_in_pad_mode(layout):
    layout["remainder"] = "pad"
    seen = np.concatenate([s.indices() for s in ranks(layout)])
    assert set(seen.tolist()) == set(range(layout["num_samples"]))


@settings(max_examples=150, deadline=None)
@given(layouts)
def test_no_overlap_across_ranks_in_drop_mode(layout):
    layout["remainder"] = "drop"
    seen = np.concatenate([s.indices() for s in ranks(layout)])
    assert len(seen) == len(set(seen.tolist()))
    assert len(seen) == layout["num_samples"] // layout["num_replicas"] * layout["num_replicas"]


@settings(max_examples=150, deadline=None)
@given(layouts)
def test_every_rank_runs_the_same_number_of_batches(layout):
    samplers = ranks(layout)
    counts = {len(list(s)) for s in samplers}
    assert counts == {len(samplers[0])}


@settings(max_examples=100, deadline=None)
@given(layouts, st.integers(0, 1000))
def test_stream_is_a_function_of_seed_and_epoch(layout, epoch):
    first = [list(s) for s in ranks(layout, epoch)]
    again = [list(s) for s in ranks(layout, epoch)]
    assert first == again


@pytest.mark.parametrize("order", ["global", "shard"])
def test_another_epoch_gives_another_order(order):
    a, b = (DistributedBatchSampler(200, 8, num_replicas=2, rank=1, order=order, seed=7) for _ in range(2))
    b.set_epoch(1)
    assert a.indices().tolist() != b.indices().tolist()
    # "shard" keeps each rank's samples and reorders them; "global" redeals the whole set.
    same_samples = sorted(a.indices().tolist()) == sorted(b.indices().tolist())
    assert same_samples == (order == "shard")


def test_documented_global_order():
    # Shuffle everything with default_rng((seed, epoch)), pad from the start, deal round-robin.
    sampler = DistributedBatchSampler(10, 2, num_replicas=4, rank=1, seed=5)
    sampler.set_epoch(2)
    perm = np.random.default_rng((5, 2)).permutation(10)
    padded = np.concatenate([perm, perm[:2]])
    assert sampler.indices().tolist() == padded[1::4].tolist()


@pytest.mark.parametrize("bad", [dict(rank=2, num_replicas=2), dict(batch_size=0), dict(remainder="wrap")])
def test_invalid_layout_is_rejected(bad):
    with pytest.raises(ValueError):
        DistributedBatchSampler(**{"num_samples": 10, "batch_size": 2, **bad})
