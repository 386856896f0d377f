"""Deterministic, seeded, stratified train/test split.

The test split is for reporting only: nothing in dpcl tunes on it. The split
depends only on the labels, ``test_fraction`` and ``split_seed`` (not on the
run seed), so runs with different seeds are evaluated on the same test set.

scikit-learn's ``train_test_split(stratify=...)`` would do, but it is an optional
dependency and rounds per-class counts differently between versions; this
split is a few vectorised numpy lines whose result is fixed by this code.
"""

from __future__ import annotations

import math

import numpy as np

from dpcl.errors import InvalidParameterError

__all__ = ["stratified_split", "check_fraction"]


def check_fraction(name: str, value: float, *, low_open: bool = True, high_open: bool = True) -> float:
    """``value`` as a float in (0, 1) (bounds included when not open); raises InvalidParameterError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise InvalidParameterError(f"{name} must be a finite number, got {value!r}.")
    v = float(value)
    low_ok = v > 0 if low_open else v >= 0
    high_ok = v < 1 if high_open else v <= 1
    if not (low_ok and high_ok):
        lo = "(0" if low_open else "[0"
        hi = "1)" if high_open else "1]"
        raise InvalidParameterError(f"{name} must lie in {lo}, {hi}, got {v!r}.")
    return v


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, test)`` with ``round(test_fraction * n_c)`` test examples of each class ``c``.

    Within each class the examples are ranked by a seeded random permutation; the
    first ``round(test_fraction * n_c)`` go to the test split. Both index arrays are
    sorted ascending. Every class with at least 2 examples keeps at least one
    example on each side.
    """
    test_fraction = check_fraction("test_fraction", test_fraction)
    labels = np.asarray(labels, dtype=np.int64)
    n = labels.shape[0]
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5E11]))
    order = rng.permutation(n)
    # stable sort by label of the shuffled order: within a label, the random order is kept
    by_label = order[np.argsort(labels[order], kind="stable")]
    sorted_labels = labels[by_label]
    counts = np.bincount(labels) if n else np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if counts.size else np.zeros(0, dtype=np.int64)
    rank = np.arange(n) - starts[sorted_labels] if n else np.zeros(0, dtype=np.int64)
    n_test = np.floor(test_fraction * counts + 0.5).astype(np.int64)
    n_test = np.where(counts >= 2, np.clip(n_test, 1, counts - 1), 0)
    is_test = rank < n_test[sorted_labels] if n else np.zeros(0, dtype=bool)
    test = np.sort(by_label[is_test])
    train = np.sort(by_label[~is_test])
    return train, test
