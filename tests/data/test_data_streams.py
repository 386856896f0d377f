"""Task streams: disjoint units, exact blurry fraction, permutations, seeding, config sections."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpcl.data import (
    STREAM_KEYS,
    LabelledDataset,
    blurry_stream,
    build_stream,
    class_incremental_stream,
    load_digits,
    parse_stream_section,
    permuted_stream,
    task_sizes,
    task_train_labels,
    task_train_unit_ids,
)
from dpcl.errors import ConfigError, DisjointnessViolationError, InvalidParameterError

SPLIT = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


@pytest.fixture(scope="module")
def digits() -> LabelledDataset:
    return load_digits()


def _synthetic(counts: list[int], n_features: int = 4) -> LabelledDataset:
    labels = np.repeat(np.arange(len(counts)), counts)
    rng = np.random.default_rng(0)
    return LabelledDataset(
        features=rng.random((labels.size, n_features)),
        labels=labels,
        unit_ids=np.arange(labels.size) * 7 + 3,
        name="synthetic",
        class_names=tuple(f"c{i}" for i in range(len(counts))),
    )


def _all_units(stream) -> np.ndarray:
    return np.concatenate([t.train.unit_ids for t in stream])


def test_class_incremental_digits(digits: LabelledDataset) -> None:
    stream = class_incremental_stream(digits, SPLIT, seed=0)
    assert len(stream) == 5
    units = _all_units(stream)
    assert np.unique(units).size == units.size  # disjoint across tasks
    stream.check_disjoint_units()
    for task, group in zip(stream, SPLIT):
        assert task.labels == tuple(group)
        assert set(np.unique(task.train.labels)) == set(group)
        assert set(np.unique(task.test.labels)) == set(group)
        # train and test never share an example
        assert np.intersect1d(task.train.unit_ids, task.test.unit_ids).size == 0
    # every digit is in exactly one task's train or test split
    all_ids = np.concatenate([units, *[t.test.unit_ids for t in stream]])
    assert np.array_equal(np.sort(all_ids), np.arange(len(digits)))
    # test split is 20 % of each class, rounded
    n_test = sum(len(t.test) for t in stream)
    assert n_test == int(np.sum(np.floor(0.2 * digits.label_counts() + 0.5)))


def test_seeding_is_reproducible_and_test_split_fixed(digits: LabelledDataset) -> None:
    a = class_incremental_stream(digits, SPLIT, seed=3)
    b = class_incremental_stream(digits, SPLIT, seed=3)
    c = class_incremental_stream(digits, SPLIT, seed=4)
    for ta, tb, tc in zip(a, b, c):
        assert np.array_equal(ta.train.unit_ids, tb.train.unit_ids)
        assert np.array_equal(ta.train.features, tb.train.features)
        # another run seed reorders training examples but keeps the same sets and the same test split
        assert not np.array_equal(ta.train.unit_ids, tc.train.unit_ids)
        assert np.array_equal(np.sort(ta.train.unit_ids), np.sort(tc.train.unit_ids))
        assert np.array_equal(ta.test.unit_ids, tc.test.unit_ids)
    other_split = class_incremental_stream(digits, SPLIT, seed=3, split_seed=1)
    assert not np.array_equal(a[0].test.unit_ids, other_split[0].test.unit_ids)


def test_empty_label_group_gives_an_empty_task(digits: LabelledDataset) -> None:
    stream = class_incremental_stream(digits, [[0, 1], [], [2]], seed=0)
    assert len(stream[1].train) == 0 and len(stream[1].test) == 0
    assert stream[1].train.features.shape == (0, 64)
    assert stream.task_sizes()[1] == 0


@pytest.mark.parametrize(
    "tasks, fragment",
    [
        ([[0, 1], [1, 2]], "label 1 is in tasks\\[0\\] and tasks\\[1\\]"),
        ([[0, 10]], "labels must be integers in \\[0, 10\\)"),
        ([[0, 0]], "repeats a label"),
        ([], "non-empty list"),
        ([[0, True]], "labels must be integers"),
        ("0,1", "non-empty list of label lists"),
    ],
)
def test_bad_label_groups(digits: LabelledDataset, tasks, fragment: str) -> None:
    with pytest.raises(InvalidParameterError, match=fragment):
        class_incremental_stream(digits, tasks, seed=0)


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5])
def test_blurry_fraction_is_exact_and_units_disjoint(digits: LabelledDataset, fraction: float) -> None:
    clear = class_incremental_stream(digits, SPLIT, seed=5)
    blurry = blurry_stream(digits, SPLIT, fraction, seed=5)
    blurry.check_disjoint_units()
    for t_clear, t_blurry in zip(clear, blurry):
        n = len(t_clear.train)
        assert len(t_blurry.train) == n  # sizes are preserved
        foreign = ~np.isin(t_blurry.train.labels, t_blurry.labels)
        assert int(foreign.sum()) == int(np.floor(fraction * n + 0.5))
        # the test set is the task's label group, as in the class-incremental stream
        assert np.array_equal(t_blurry.test.unit_ids, t_clear.test.unit_ids)
    # the same training examples, only moved between tasks
    assert np.array_equal(np.sort(_all_units(clear)), np.sort(_all_units(blurry)))


def test_blurry_is_seeded(digits: LabelledDataset) -> None:
    a = blurry_stream(digits, SPLIT, 0.2, seed=1)
    b = blurry_stream(digits, SPLIT, 0.2, seed=1)
    c = blurry_stream(digits, SPLIT, 0.2, seed=2)
    assert all(np.array_equal(x.train.unit_ids, y.train.unit_ids) for x, y in zip(a, b))
    assert any(
        not np.array_equal(np.sort(x.train.unit_ids), np.sort(z.train.unit_ids)) for x, z in zip(a, c)
    )


def test_blurry_zero_is_class_incremental(digits: LabelledDataset) -> None:
    clear = class_incremental_stream(digits, SPLIT, seed=2)
    blurry = blurry_stream(digits, SPLIT, 0.0, seed=2)
    for x, y in zip(clear, blurry):
        assert np.array_equal(x.train.unit_ids, y.train.unit_ids)


def test_blurry_refuses_an_impossible_fraction() -> None:
    # one big task cannot receive 40 % foreign examples from two small ones
    ds = _synthetic([200, 10, 10])
    with pytest.raises(InvalidParameterError, match="blurry_fraction=0.4 cannot be met"):
        blurry_stream(ds, [[0], [1], [2]], 0.4, seed=0, test_fraction=0.1)
    with pytest.raises(InvalidParameterError, match="cannot be met"):
        blurry_stream(ds, [[0, 1, 2]], 0.2, seed=0)  # a single task has no other task to take from
    with pytest.raises(InvalidParameterError, match="blurry_fraction must lie in"):
        blurry_stream(ds, [[0], [1, 2]], 1.0, seed=0)


@given(
    counts=st.lists(st.integers(2, 40), min_size=2, max_size=6),
    fraction=st.floats(0.0, 0.5),
    seed=st.integers(0, 10_000),
)
def test_blurry_property(counts: list[int], fraction: float, seed: int) -> None:
    ds = _synthetic(counts)
    groups = [[c] for c in range(len(counts))]
    try:
        stream = blurry_stream(ds, groups, fraction, seed=seed)
    except InvalidParameterError as exc:
        # refused only when infeasible: the largest donation exceeds all others together
        clear = class_incremental_stream(ds, groups, seed=seed)
        d = np.floor(fraction * np.array(clear.task_sizes()) + 0.5)
        assert 2 * d.max() > d.sum(), exc
        return
    stream.check_disjoint_units()
    clear = class_incremental_stream(ds, groups, seed=seed)
    for x, y in zip(clear, stream):
        foreign = ~np.isin(y.train.labels, y.labels)
        assert foreign.sum() == np.floor(fraction * len(x.train) + 0.5)
        assert len(x.train) == len(y.train)


def test_permuted_stream(digits: LabelledDataset) -> None:
    stream = permuted_stream(digits, 4, seed=0)
    stream.check_disjoint_units()
    sizes = stream.task_sizes()
    assert max(sizes) - min(sizes) <= 1
    base = class_incremental_stream(digits, [list(range(10))], seed=0)
    assert sum(sizes) == len(base[0].train)
    perms = [t.permutation for t in stream]
    assert len({tuple(p) for p in perms}) == 4
    for task in stream:
        assert task.labels == tuple(range(10))
        assert sorted(task.permutation.tolist()) == list(range(64))
        # features are the original pixels permuted: undo the permutation and find the original rows
        inverse = np.argsort(task.permutation)
        original = digits.features[task.train.unit_ids]  # digits' unit id is its row index
        assert np.array_equal(task.train.features[:, inverse], original)
        assert len(task.test) == len(base[0].test)  # each task is tested on the whole test split
    again = permuted_stream(digits, 4, seed=0)
    assert all(np.array_equal(a.permutation, b.permutation) for a, b in zip(stream, again))
    with pytest.raises(InvalidParameterError, match="n_tasks"):
        permuted_stream(digits, 0, seed=0)


def test_check_disjoint_units_names_a_shared_unit() -> None:
    ds = _synthetic([4, 4])
    stream = class_incremental_stream(ds, [[0], [1]], seed=0)
    from dpcl.data.streams import Task, TaskStream

    shared = stream[0].train.unit_ids[0]
    clash = Task(1, stream[0].train.subset([0]), stream[1].test, (1,))
    broken = TaskStream((stream[0], clash), "class_incremental", "synthetic", ds.class_names, 0)
    with pytest.raises(DisjointnessViolationError, match=f"tasks 0 and 1 share privacy unit {shared}"):
        broken.check_disjoint_units()


def test_joint_train_and_seen_test(digits: LabelledDataset) -> None:
    stream = class_incremental_stream(digits, SPLIT, seed=0)
    assert len(stream.joint_train()) == sum(stream.task_sizes())
    assert len(stream.seen_test(1)) == len(stream[0].test) + len(stream[1].test)


# ---------------------------------------------------------------- config sections


@pytest.mark.parametrize(
    "section",
    [
        {"dataset": "digits", "tasks": SPLIT, "seed": 1},
        {"dataset": "digits", "tasks": SPLIT, "kind": "blurry", "blurry_fraction": 0.3, "seed": 2},
        {"dataset": "digits", "kind": "permuted", "n_tasks": 3, "seed": 4, "test_fraction": 0.25},
        {"dataset": "digits", "tasks": [[0, 1, 2], [3]], "split_seed": 7, "label_space": "prior_const",
         "prior_labels": [[0, 1, 2], [3]], "disjoint_units": True},
    ],
)
def test_task_sizes_match_the_built_stream(section: dict) -> None:
    stream = build_stream(section)
    assert task_sizes(section) == stream.task_sizes()
    labels = task_train_labels(section)
    assert [y.tolist() for y in labels] == [t.train.labels.tolist() for t in stream]
    units = task_train_unit_ids(section)
    assert [u.tolist() for u in units] == [u.tolist() for u in stream.unit_ids()]


def test_stream_keys_are_documented() -> None:
    for name, (types, _default, help_text) in STREAM_KEYS.items():
        assert isinstance(name, str) and help_text
        assert isinstance(types, (type, tuple))
    parsed = parse_stream_section({"dataset": "digits", "tasks": SPLIT})
    assert parsed["kind"] == "class_incremental" and parsed["test_fraction"] == 0.2 and parsed["seed"] == 0


@pytest.mark.parametrize(
    "section, fragment",
    [
        ({"tasks": SPLIT}, "dataset is required"),
        ({"dataset": "digits", "tasks": SPLIT, "blury_fraction": 0.1}, "unknown \\[stream\\] key\\(s\\) blury_fraction"),
        ({"dataset": "digits", "tasks": SPLIT, "kind": "stripes"}, "kind must be one of"),
        ({"dataset": "digits"}, "tasks is required"),
        ({"dataset": "digits", "tasks": SPLIT, "seed": "1"}, "seed must be of type int"),
        ({"dataset": "digits", "tasks": SPLIT, "seed": True}, "seed must be of type int"),
        ({"dataset": "digits", "tasks": SPLIT, "test_fraction": 1.5}, "test_fraction must lie in"),
        ({"dataset": "digits", "tasks": SPLIT, "test_fraction": float("nan")}, "test_fraction must lie in"),
        ({"dataset": "digits", "tasks": SPLIT, "dataset_options": []}, "dataset_options must be of type dict"),
        ({"dataset": "digits", "kind": "permuted", "n_tasks": 0}, "n_tasks must be an integer >= 1"),
        ({"dataset": "digits", "tasks": SPLIT, "kind": "blurry", "blurry_fraction": 1}, "blurry_fraction must lie in"),
        ({"dataset": "digits", "tasks": [[0, 1], [1]]}, "label 1 is in tasks"),
        ({"dataset": "nope", "tasks": SPLIT}, "unknown dataset 'nope'"),
        ({"dataset": "digits", "tasks": SPLIT, "dataset_options": {"size": 3}}, "has no option\\(s\\) size"),
    ],
)
def test_bad_sections_raise_config_or_parameter_errors(section: dict, fragment: str) -> None:
    with pytest.raises(InvalidParameterError, match=fragment):
        task_sizes(section)


def test_section_errors_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        task_sizes({"dataset": "digits", "tasks": [[0, 1], [1]]})
    with pytest.raises(ConfigError):
        build_stream({"dataset": "digits", "tasks": SPLIT, "colour": "red"})


def test_permuted_keeps_each_unit_in_one_task() -> None:
    # 60 examples from 12 people (5 each): tasks are cut by person, not by example
    labels = np.arange(60) % 3
    people = np.repeat(np.arange(12) * 11, 5)
    ds = LabelledDataset(np.random.default_rng(0).random((60, 6)), labels, people, "people", ("a", "b", "c"))
    stream = permuted_stream(ds, 4, seed=1)
    stream.check_disjoint_units()
    train_people = [set(np.unique(t.train.unit_ids).tolist()) for t in stream]
    n_people = [len(p) for p in train_people]
    assert max(n_people) - min(n_people) <= 1
    # every training example of a person went to that person's task
    train_split = class_incremental_stream(ds, [[0, 1, 2]], seed=1)[0].train
    for person in np.unique(train_split.unit_ids):
        owners = [t.index for t in stream if person in train_people[t.index]]
        assert len(owners) == 1
        assert int(np.sum(stream[owners[0]].train.unit_ids == person)) == int(np.sum(train_split.unit_ids == person))
    with pytest.raises(InvalidParameterError, match="at most one task per privacy unit"):
        permuted_stream(ds, 13, seed=1)


@given(
    n_classes=st.integers(2, 8),
    data=st.data(),
    seed=st.integers(0, 1000),
)
def test_class_incremental_property(n_classes: int, data, seed: int) -> None:
    counts = data.draw(st.lists(st.integers(1, 12), min_size=n_classes, max_size=n_classes))
    ds = _synthetic(counts)
    # a random assignment of a random subset of the labels to 1..4 tasks
    task_of = data.draw(st.lists(st.integers(-1, 3), min_size=n_classes, max_size=n_classes))
    groups = [[c for c in range(n_classes) if task_of[c] == t] for t in range(max(max(task_of), 0) + 1)]
    stream = class_incremental_stream(ds, groups, seed=seed)
    stream.check_disjoint_units()
    assert len(stream) == len(groups)
    for task, group in zip(stream, groups):
        assert np.isin(task.train.labels, group).all() and np.isin(task.test.labels, group).all()
    used = [c for g in groups for c in g]
    train_split = class_incremental_stream(ds, [list(range(n_classes))], seed=seed)[0].train
    expected = np.sort(train_split.unit_ids[np.isin(train_split.labels, used)])
    assert np.array_equal(np.sort(np.concatenate([t.train.unit_ids for t in stream])), expected)


@pytest.mark.parametrize(
    "section",
    [
        {"dataset": "digits", "tasks": SPLIT},
        {"dataset": "digits", "tasks": SPLIT, "kind": "blurry", "blurry_fraction": 0.3},
        {"dataset": "digits", "kind": "permuted", "n_tasks": 4},
    ],
)
def test_task_sizes_do_not_depend_on_the_run_seed(section: dict) -> None:
    # so an audit at one seed plans DP-SGD for the sizes every seed trains on
    sizes = {tuple(task_sizes({**section, "seed": seed})) for seed in (0, 1, 17, 2**31)}
    assert len(sizes) == 1
