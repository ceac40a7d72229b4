"""The parameter servers' sparse tables (unitrain/spec/ps_table.py): rows created on first sight,
Paddle's update rules, checkpoints of rows and rule state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unitrain.spec.ps_table import INITIAL_G2SUM, SparseTable, initial_rows

INIT = 0.01


def _table(rule="sgd", lr=0.1, width=3, seed=7) -> SparseTable:
    return SparseTable(width=width, rule=rule, lr=lr, seed=seed, init_scale=INIT)


def test_rows_are_created_when_first_seen_and_start_from_their_id_alone():
    table = _table()
    first = table.pull(np.array([10**12, 5, 7]))
    assert table.rows == 3 and table.nbytes == 3 * 3 * 4
    # A row's start depends on (seed, id) only: not on the order ids arrive in, nor the table.
    again = _table().pull(np.array([7, 5, 10**12]))
    assert np.array_equal(first, again[::-1])
    assert np.abs(first).max() <= INIT and len(np.unique(first)) == first.size
    assert not np.array_equal(_table(seed=8).pull(np.array([5])), first[1:2])
    # Prediction reads rows without creating any: an unseen id gets its initial row.
    peeked = table.peek(np.array([5, 99]))
    assert table.rows == 3
    assert np.array_equal(peeked[0], first[1]) and np.array_equal(
        peeked[1], initial_rows(np.array([99]), 3, 7, INIT)[0]
    )


def test_a_billion_buckets_cost_no_more_memory_than_a_thousand():
    ids = np.arange(0, 200)
    small, large = _table(), _table()
    small.pull(ids % 1000)
    large.pull(ids * 5_000_000 % 10**9)
    assert small.nbytes == large.nbytes == 200 * 3 * 4


def test_sgd_and_adagrad_follow_their_rules():
    table = _table("sgd", lr=0.5)
    w0 = table.pull(np.array([1, 2])).copy()
    grads = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 0.5]], np.float32)
    table.push(np.array([1, 2]), grads, np.array([1, 1]), pushed=2)
    assert np.allclose(table.pull(np.array([1, 2])), w0 - 0.5 * grads)

    table = _table("adagrad", lr=0.5)
    w0 = table.pull(np.array([1, 2])).copy()
    counts, pushed = np.array([2, 1]), 4
    table.push(np.array([1, 2]), grads, counts, pushed)
    # A row's gradient becomes the mean over its occurrences times the ids pushed, as Paddle scales it.
    scaled = grads * (pushed / counts)[:, None]
    assert np.allclose(table.pull(np.array([1, 2])), w0 - 0.5 * scaled, atol=1e-6)  # G starts at 0
    w1 = table.pull(np.array([1, 2])).copy()
    table.push(np.array([1, 2]), grads, counts, pushed)
    expected = w1 - 0.5 * scaled * np.sqrt(INITIAL_G2SUM / (INITIAL_G2SUM + scaled**2))
    assert np.allclose(table.pull(np.array([1, 2])), expected, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(0, 2**31))
def test_adam_on_rows_updated_every_step_is_torch_adam(steps, seed):
    rng = np.random.default_rng(seed)
    table = _table("adam", lr=0.01, width=4)
    ids = np.array([3, 11])
    param = torch.nn.Parameter(torch.from_numpy(table.pull(ids).copy()))
    adam = torch.optim.Adam([param], lr=0.01, eps=1e-8)
    for _ in range(steps):
        grads = rng.normal(size=(2, 4)).astype(np.float32)
        table.push(ids, grads, np.array([1, 1]), pushed=2)
        param.grad = torch.from_numpy(grads)
        adam.step()
    # Paddle's form keeps the bias corrections in float32 and epsilon outside them: each step
    # moves within 0.5% of torch's (a step moves a value by about lr).
    assert np.allclose(table.pull(ids), param.detach().numpy(), rtol=0, atol=0.005 * 0.01 * steps)


def test_adam_counts_each_rows_own_steps():
    table = _table("adam", lr=0.01, width=2)
    ids = np.array([1])
    for _ in range(3):
        table.push(ids, np.ones((1, 2), np.float32), np.array([1]), pushed=1)
    before = table.pull(np.array([2])).copy()
    table.push(np.array([2]), np.ones((1, 2), np.float32), np.array([1]), pushed=1)
    # Row 2's first update is a first Adam step (lr times the sign), whatever the others took.
    assert np.allclose(table.pull(np.array([2])), before - 0.01, atol=1e-6)


@pytest.mark.parametrize("rule", ["sgd", "adagrad", "adam"])
def test_a_table_saved_and_loaded_goes_on_bit_for_bit(rule):
    rng = np.random.default_rng(0)
    pushes = [(np.unique(rng.integers(0, 50, 20)), rng.normal(size=(50, 3)).astype(np.float32)) for _ in range(6)]

    def apply(table, todo):
        for ids, grads in todo:
            table.push(ids, grads[: len(ids)], np.ones(len(ids), np.int64), len(ids))

    whole, resumed = _table(rule), _table(rule)
    apply(whole, pushes)
    apply(resumed, pushes[:3])
    loaded = _table(rule)
    loaded.add(resumed.arrays())
    apply(loaded, pushes[3:])
    a, b = whole.arrays(), loaded.arrays()
    order_a, order_b = np.argsort(a["ids"]), np.argsort(b["ids"])
    for key in a:
        assert np.array_equal(a[key][order_a], b[key][order_b]), key


def _serving(rng, ids):
    from unitrain.spec.serving import Serving

    widths = [13 + 26 * 4, 8, 1]
    layers = [
        (rng.normal(size=(a, b)).astype(np.float32), rng.normal(size=b).astype(np.float32))
        for a, b in zip(widths, widths[1:])
    ]
    layers.append((rng.normal(size=(13, 1)).astype(np.float32), rng.normal(size=1).astype(np.float32)))
    rows = rng.normal(size=(len(ids), 5)).astype(np.float32)
    return Serving.of(ids=ids, rows=rows, layers=layers, mean=np.zeros(13), std=np.ones(13), buckets=10**9)


def test_a_served_model_reads_unknown_ids_as_zero_rows_and_saves_whole(tmp_path):
    from unitrain.spec.serving import Serving

    rng = np.random.default_rng(0)
    ids = np.array([10**8, 3, 77, 5], np.int64)
    serving = _serving(rng, ids)
    located = serving.locate(np.array([[3, 77, 10**8, 4, 10**9 - 1]]))
    assert located.tolist() == [[0, 2, 3, 4, 4]]  # sorted vocabulary; unknown ids: the last row
    assert not serving.rows[4].any()
    dense, rows = rng.normal(size=(6, 13)).astype(np.float32), rng.integers(0, 5, (6, 26))
    p = serving.predict(dense, rows)
    assert p.shape == (6,) and ((p > 0) & (p < 1)).all()
    serving.save(tmp_path)
    again = Serving.load(tmp_path)
    assert np.array_equal(again.predict(dense, rows), p) and again.buckets == 10**9
