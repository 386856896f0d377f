"""A task stream: the tasks of a continual-learning stream, each with its training and test split, labels
and privacy-unit ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import numpy as np

from dpcl.data.dataset import LabelledDataset, concatenate
from dpcl.errors import DisjointnessViolationError


@dataclass(frozen=True, eq=False)
class Task:
    """One task of a stream.

    Attributes:
        index: 0-based position in the stream.
        train: the task's training examples D_t (the data its privacy events are charged to).
        test: the task's test examples (reporting only).
        labels: the task's label group (for ``blurry`` streams, ``train`` also holds a
            fraction of examples with other tasks' labels; for ``permuted``, all labels).
        permutation: the feature permutation of a ``permuted`` task (``features[:, permutation]``),
            else None.
    """

    index: int
    train: LabelledDataset
    test: LabelledDataset
    labels: tuple[int, ...]
    permutation: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class TaskStream:
    """An ordered sequence of tasks built from one dataset."""

    tasks: tuple[Task, ...]
    kind: str
    dataset_name: str
    class_names: tuple[str, ...]
    seed: int
    options: Mapping[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def __getitem__(self, index: int) -> Task:
        return self.tasks[index]

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    def task_sizes(self) -> list[int]:
        """Training-set size of each task."""
        return [len(t.train) for t in self.tasks]

    def unit_ids(self) -> list[np.ndarray]:
        """The privacy-unit ids of each task's training set."""
        return [t.train.unit_ids for t in self.tasks]

    def check_disjoint_units(self) -> None:
        """Raise DisjointnessViolationError if two tasks' training sets share a unit (names one)."""
        ids = [np.unique(u) for u in self.unit_ids()]
        if not ids:
            return
        owner = np.concatenate([np.full(u.size, i) for i, u in enumerate(ids)])
        flat = np.concatenate(ids)
        order = np.argsort(flat, kind="stable")
        dup = np.flatnonzero(flat[order][1:] == flat[order][:-1])
        if dup.size:
            unit = int(flat[order][dup[0]])
            a, b = int(owner[order][dup[0]]), int(owner[order][dup[0] + 1])
            raise DisjointnessViolationError(
                f"tasks {a} and {b} share privacy unit {unit}; tasks declared disjoint must hold disjoint units."
            )

    def joint_train(self) -> LabelledDataset:
        """All tasks' training examples together (the Non-CL baseline's data, Tobaben et al. Alg. A3)."""
        return concatenate([t.train for t in self.tasks], name=f"{self.dataset_name}:joint")

    def seen_test(self, task_index: int) -> LabelledDataset:
        """Test examples of tasks 0..task_index together."""
        return concatenate([t.test for t in self.tasks[: task_index + 1]], name=f"{self.dataset_name}:seen")

    def describe(self) -> dict[str, Any]:
        """JSON-able summary: kind, dataset, seed, per-task sizes and labels."""
        return {
            "kind": self.kind,
            "dataset": self.dataset_name,
            "seed": self.seed,
            "options": dict(self.options),
            "class_names": list(self.class_names),
            "tasks": [
                {"index": t.index, "labels": list(t.labels), "n_train": len(t.train), "n_test": len(t.test)}
                for t in self.tasks
            ],
        }
