"""LabelledDataset: validation, immutability, subsets keep unit ids; stratified split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpcl.data import LabelledDataset, concatenate, stratified_split
from dpcl.errors import InvalidParameterError


def _toy(n: int = 6) -> LabelledDataset:
    return LabelledDataset(
        features=np.arange(n * 2, dtype=np.float64).reshape(n, 2),
        labels=np.arange(n) % 3,
        unit_ids=np.arange(100, 100 + n),
        name="toy",
        class_names=("a", "b", "c"),
    )


def test_arrays_are_typed_read_only_copies() -> None:
    features = np.ones((3, 2))
    ds = LabelledDataset(features, np.array([0, 1, 0]), np.array([5, 6, 7]), "x", ("p", "q"))
    assert ds.features.dtype == np.float32 and ds.labels.dtype == np.int64 and ds.unit_ids.dtype == np.int64
    features[0, 0] = 9.0
    assert ds.features[0, 0] == 1.0
    with pytest.raises(ValueError):
        ds.features[0, 0] = 2.0
    with pytest.raises(ValueError):
        ds.unit_ids[0] = 1


def test_subset_keeps_labels_units_and_order() -> None:
    ds = _toy()
    sub = ds.subset([4, 1])
    assert sub.labels.tolist() == [1, 1]
    assert sub.unit_ids.tolist() == [104, 101]
    assert sub.features.tolist() == [[8.0, 9.0], [2.0, 3.0]]
    assert sub.class_names == ds.class_names
    assert len(ds.subset([])) == 0 and ds.subset([]).features.shape == (0, 2)


def test_concatenate_keeps_unit_ids() -> None:
    ds = _toy()
    joint = concatenate([ds.subset([0, 1]), ds.subset([5])])
    assert joint.unit_ids.tolist() == [100, 101, 105]


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"labels": np.array([0, 3, 1])}, "labels must lie in [0, 3)"),
        ({"unit_ids": np.array([1, 2])}, "unit_ids must be an integer array of shape (3,)"),
        ({"features": np.ones((2, 2))}, "n_examples = 3"),
        ({"features": np.array([[np.nan], [0.0], [1.0]])}, "finite"),
        ({"features": None}, "needs features, texts, or both"),
        ({"labels": np.array([0.0, 1.0, 2.0])}, "labels must be integers"),
    ],
)
def test_invalid_datasets_are_refused(kwargs: dict, fragment: str) -> None:
    base = {"features": np.ones((3, 2)), "labels": np.array([0, 1, 2]), "unit_ids": np.array([1, 2, 3]),
            "name": "x", "class_names": ("a", "b", "c")}
    with pytest.raises(InvalidParameterError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        LabelledDataset(**{**base, **kwargs})


def test_stratified_split_counts_by_hand() -> None:
    labels = np.array([0] * 10 + [1] * 5 + [2] * 1)
    train, test = stratified_split(labels, 0.2, seed=0)
    # round(0.2 * 10) = 2, round(0.2 * 5) = 1, a class of one example stays in train
    assert np.bincount(labels[test], minlength=3).tolist() == [2, 1, 0]
    assert np.bincount(labels[train], minlength=3).tolist() == [8, 4, 1]
    assert np.intersect1d(train, test).size == 0
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(labels.size))


@given(
    labels=st.lists(st.integers(0, 4), min_size=1, max_size=200),
    fraction=st.floats(0.05, 0.95),
    seed=st.integers(0, 2**31),
)
def test_stratified_split_is_a_seeded_partition(labels: list[int], fraction: float, seed: int) -> None:
    labels = np.array(labels)
    train, test = stratified_split(labels, fraction, seed)
    again = stratified_split(labels, fraction, seed)
    assert np.array_equal(train, again[0]) and np.array_equal(test, again[1])
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(labels.size))
    counts = np.bincount(labels, minlength=5)
    test_counts = np.bincount(labels[test], minlength=5)
    expected = np.where(counts >= 2, np.clip(np.floor(fraction * counts + 0.5), 1, counts - 1), 0)
    assert np.array_equal(test_counts, expected)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, float("nan"), True])
def test_split_fraction_out_of_range(fraction: float) -> None:
    with pytest.raises(InvalidParameterError, match="test_fraction"):
        stratified_split(np.array([0, 1, 0, 1]), fraction, 0)


def test_datasets_and_streams_pickle_and_meta_is_read_only() -> None:
    import copy
    import pickle

    from dpcl.data import class_incremental_stream

    ds = LabelledDataset(np.ones((4, 2)), np.array([0, 1, 0, 1]), np.arange(4), "x", ("a", "b"), meta={"k": 1})
    with pytest.raises(TypeError, match="read-only"):
        ds.meta["k"] = 2
    with pytest.raises(TypeError, match="read-only"):
        ds.meta.update(k=3)
    back = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(back.features, ds.features) and back.meta == {"k": 1}
    assert not back.features.flags.writeable
    stream = class_incremental_stream(ds, [[0], [1]], seed=0, test_fraction=0.5)
    again = pickle.loads(pickle.dumps(stream))
    assert again.task_sizes() == stream.task_sizes() == [1, 1]
    assert copy.deepcopy(ds).meta == {"k": 1}
    assert ds.with_features(np.zeros((4, 3)), note="z").meta == {"k": 1, "note": "z"}
