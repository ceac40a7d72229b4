"""Top-k accuracy, as the step log and the held-out evaluation count it."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from unitrain.train.evaluation import correct_in_topk
from unitrain.train.metrics import topk_accuracy


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 40), st.integers(2, 12), st.integers(0, 2**31 - 1))
def test_distinct_scores_count_as_a_sort_would(samples, classes, seed):
    rng = np.random.default_rng(seed)
    logits = rng.permutation(samples * classes).reshape(samples, classes).astype(np.float32)
    labels = rng.integers(0, classes, samples)
    order = np.argsort(-logits, axis=1)
    for k in (1, 5):
        expected = np.any(order[:, : min(k, classes)] == labels[:, None], axis=1)
        assert correct_in_topk(logits, labels, k) == expected.sum()
    top1, top5 = topk_accuracy(logits, labels)
    assert top1 == np.mean(order[:, 0] == labels)
    assert top5 == np.mean(np.any(order[:, :5] == labels[:, None], axis=1))


def test_ties_and_nan_are_never_counted_right():
    # A model that scores every class alike (or NaN) has learnt nothing: 0, not 1.
    labels = np.array([0, 3])
    assert topk_accuracy(np.zeros((2, 10), np.float32), labels) == (0.0, 0.0)
    assert correct_in_topk(np.full((2, 10), np.nan, np.float32), labels, 5) == 0
    # A label tied with one other class is in the top 2 but not the top 1.
    logits = np.array([[2.0, 2.0, 1.0]], np.float32)
    assert correct_in_topk(logits, np.array([1]), 1) == 0 and correct_in_topk(logits, np.array([1]), 2) == 1


def test_a_language_models_positions_are_each_a_sample():
    logits = np.zeros((2, 3, 4), np.float32)
    labels = np.array([[0, 1, 2], [3, 0, 1]])
    logits[0, :, 0] = 1.0  # right at position 0 only
    top1, _ = topk_accuracy(logits, labels)
    assert top1 == 1 / 6
