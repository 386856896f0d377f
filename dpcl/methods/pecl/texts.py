"""The fortunes text stream PeCL trains on and the public corpus its language model is pre-trained on.

Fortune categories are the classes: :func:`fortunes_text_stream` makes ``n_tasks`` class-incremental tasks of
``classes_per_task`` categories each (:func:`dpcl.data.class_incremental_stream`); a disjoint set of
categories (:data:`PUBLIC_CATEGORIES`) is the public pre-training corpus (:func:`public_corpus`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpcl.data import class_incremental_stream
from dpcl.data.fortunes import load_fortunes_texts
from dpcl.errors import InvalidParameterError

__all__ = ["PUBLIC_CATEGORIES", "STREAM_CATEGORIES", "TextTask", "fortunes_text_stream", "public_corpus"]


#: Categories used as the private task stream (two per task) and the public pre-training corpus.
STREAM_CATEGORIES = ("computers", "food", "law", "love", "politics", "science", "sports", "startrek", "work", "education")


PUBLIC_CATEGORIES = ("fortunes", "humorists", "literature", "wisdom", "platitudes")


@dataclass(frozen=True)
class TextTask:
    train_texts: tuple[str, ...]
    train_labels: np.ndarray
    test_texts: tuple[str, ...]
    test_labels: np.ndarray
    #: the task's public label set (its categories), fixed before training
    label_set: tuple[int, ...] = ()


def fortunes_text_stream(
    n_tasks: int = 5,
    classes_per_task: int = 2,
    max_per_class: int = 60,
    seed: int = 0,
    public_per_category: int = 200,
) -> tuple[list[TextTask], list[str], tuple[str, ...]]:
    """Class-incremental fortunes tasks (raw text) and the public pre-training texts."""
    n_classes = n_tasks * classes_per_task
    if n_classes > len(STREAM_CATEGORIES):
        raise InvalidParameterError(
            f"n_tasks * classes_per_task must be <= {len(STREAM_CATEGORIES)} categories, got {n_classes}."
        )
    dataset = load_fortunes_texts(STREAM_CATEGORIES[:n_classes], max_per_class=max_per_class)
    groups = [list(range(t * classes_per_task, (t + 1) * classes_per_task)) for t in range(n_tasks)]
    stream = class_incremental_stream(dataset, groups, seed)
    tasks = [
        TextTask(
            train_texts=tuple(str(x) for x in task.train.texts),
            train_labels=np.asarray(task.train.labels, dtype=np.int64),
            test_texts=tuple(str(x) for x in task.test.texts),
            test_labels=np.asarray(task.test.labels, dtype=np.int64),
            label_set=tuple(int(c) for c in group),
        )
        for task, group in zip(stream, groups)
    ]
    public = load_fortunes_texts(PUBLIC_CATEGORIES, max_per_class=public_per_category, min_count=1)
    return tasks, [str(x) for x in public.texts], dataset.class_names


def public_corpus(public_per_category: int = 200) -> tuple[list[str], np.ndarray]:
    """The public pre-training texts and their category (Score_2's groups under ``training = "dp_sgd"``)."""
    public = load_fortunes_texts(PUBLIC_CATEGORIES, max_per_class=public_per_category, min_count=1)
    return [str(x) for x in public.texts], np.asarray(public.labels, dtype=np.int64)
