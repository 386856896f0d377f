"""Index plans of a stream: which examples go to which task, computed from the labels (and unit ids) alone,
so that ``dpcl audit`` plans for exactly the task sizes ``dpcl run`` trains on without loading features."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from dpcl.data.splits import stratified_split
from dpcl.errors import InvalidParameterError


# ----------------------------------------------------------------------------------------------
# argument checks


def _check_seed(name: str, seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or int(seed) < 0:
        raise InvalidParameterError(f"{name} must be an integer >= 0, got {seed!r}.")
    return int(seed)


def _check_label_groups(tasks: Any, n_classes: int) -> tuple[tuple[int, ...], ...]:
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence) or len(tasks) == 0:
        raise InvalidParameterError(f"tasks must be a non-empty list of label lists, e.g. [[0, 1], [2, 3]]; got {tasks!r}.")
    groups = []
    for t, group in enumerate(tasks):
        if isinstance(group, (str, bytes)) or not isinstance(group, Sequence):
            raise InvalidParameterError(f"tasks[{t}] must be a list of integer labels, got {group!r}.")
        labels = []
        for label in group:
            if isinstance(label, bool) or not isinstance(label, (int, np.integer)) or not 0 <= int(label) < n_classes:
                raise InvalidParameterError(
                    f"tasks[{t}] holds {label!r}; labels must be integers in [0, {n_classes})."
                )
            labels.append(int(label))
        if len(set(labels)) != len(labels):
            raise InvalidParameterError(f"tasks[{t}] repeats a label: {labels}.")
        groups.append(tuple(labels))
    seen: dict[int, int] = {}
    for t, group in enumerate(groups):
        for label in group:
            if label in seen:
                raise InvalidParameterError(
                    f"label {label} is in tasks[{seen[label]}] and tasks[{t}]; label groups must not overlap "
                    "(use kind = \"blurry\" for tasks that share labels)."
                )
            seen[label] = t
    return tuple(groups)


def _rng(seed: int, *tags: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, *tags]))


_TAG_ORDER, _TAG_BLURRY, _TAG_PERMUTE = 0x0DE, 0xB1, 0x9E


# ----------------------------------------------------------------------------------------------
# index plans: which train/test indices go to which task (labels only)


def _plan_class_incremental(
    train_labels: np.ndarray, test_labels: np.ndarray, groups: tuple[tuple[int, ...], ...], seed: int, n_classes: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    task_of_label = np.full(n_classes, -1, dtype=np.int64)
    for t, group in enumerate(groups):  # loop over tasks, not examples
        task_of_label[list(group)] = t
    train_task = task_of_label[train_labels]
    test_task = task_of_label[test_labels]
    plans = []
    for t in range(len(groups)):
        train_idx = np.flatnonzero(train_task == t)
        train_idx = train_idx[_rng(seed, _TAG_ORDER, t).permutation(train_idx.size)]
        plans.append((train_idx, np.flatnonzero(test_task == t)))
    return plans


def _plan_blurry(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    groups: tuple[tuple[int, ...], ...],
    blurry_fraction: float,
    seed: int,
    n_classes: int,
) -> list[tuple[np.ndarray, np.ndarray]]:
    base = _plan_class_incremental(train_labels, test_labels, groups, seed, n_classes)  # own pools, shuffled
    n_own = np.array([p[0].size for p in base], dtype=np.int64)
    donate = np.floor(blurry_fraction * n_own + 0.5).astype(np.int64)
    total = int(donate.sum())
    if total == 0:
        return base
    largest = int(donate.max())
    if 2 * largest > total:
        t = int(donate.argmax())
        raise InvalidParameterError(
            f"blurry_fraction={blurry_fraction} cannot be met: task {t} must take {largest} examples from "
            f"other tasks but they give away only {total - largest} in all; lower blurry_fraction, "
            "balance the task sizes or add tasks."
        )
    rng = _rng(seed, _TAG_BLURRY)
    block_order = rng.permutation(len(base))
    # donated examples (the first d_t of each shuffled own pool), laid out block by block
    donated = np.concatenate([base[t][0][: donate[t]] for t in block_order])
    receiver = np.repeat(block_order, donate[block_order])
    shift = int(rng.integers(largest, total - largest + 1))
    # the item at position i goes to the task owning slot (i + shift) mod total
    receiving_task = receiver[(np.arange(total) + shift) % total]
    plans = []
    for t, (own, test_idx) in enumerate(base):
        train_idx = np.concatenate([own[donate[t]:], donated[receiving_task == t]])
        train_idx = train_idx[_rng(seed, _TAG_ORDER, len(base) + t).permutation(train_idx.size)]
        plans.append((train_idx, test_idx))
    return plans


def _plan_permuted(train_units: np.ndarray, n_test: int, n_tasks: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    # chunks of *units* (not examples), so a unit with several examples stays in one task
    units, inverse = np.unique(train_units, return_inverse=True)
    chunk_sizes = [c.size for c in np.array_split(np.arange(units.size), n_tasks)]
    chunk_of_unit = np.empty(units.size, dtype=np.int64)
    chunk_of_unit[_rng(seed, _TAG_ORDER).permutation(units.size)] = np.repeat(np.arange(n_tasks), chunk_sizes)
    task_of_example = chunk_of_unit[inverse]
    plans = []
    for t in range(n_tasks):
        train_idx = np.flatnonzero(task_of_example == t)
        plans.append((train_idx[_rng(seed, _TAG_ORDER, t).permutation(train_idx.size)], np.arange(n_test)))
    return plans


def _check_n_tasks(n_tasks: Any, n_units: int) -> int:
    if isinstance(n_tasks, bool) or not isinstance(n_tasks, (int, np.integer)) or not 1 <= int(n_tasks) <= max(n_units, 1):
        raise InvalidParameterError(
            f"n_tasks must be an integer in [1, {max(n_units, 1)}] (at most one task per privacy unit of the "
            f"training split), got {n_tasks!r}."
        )
    return int(n_tasks)


HOLDOUTS = ("stratified", "dataset")


def _split_indices(
    labels: np.ndarray, test_fraction: float, split_seed: int, holdout: str, own_test_start: int | None, name: str
) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, test)``: stratified by ``test_fraction`` and ``split_seed``, or the dataset's own
    split (examples before ``own_test_start`` train, the rest test)."""
    if holdout == "stratified":
        return stratified_split(labels, test_fraction, _check_seed("split_seed", split_seed))
    if holdout != "dataset":
        raise InvalidParameterError(f"holdout must be one of {', '.join(HOLDOUTS)}, got {holdout!r}.")
    if own_test_start is None:
        raise InvalidParameterError(
            f"holdout = 'dataset' needs a dataset with its own test split loaded with it (idx: or cifar: with "
            f"dataset_options split = 'all'); {name!r} has none. Use holdout = 'stratified'."
        )
    n = labels.shape[0]
    if not 0 < own_test_start < n:
        raise InvalidParameterError(
            f"holdout = 'dataset' needs training and test examples; {name!r} has {own_test_start} training "
            f"and {n - own_test_start} test examples."
        )
    return np.arange(own_test_start, dtype=np.int64), np.arange(own_test_start, n, dtype=np.int64)

