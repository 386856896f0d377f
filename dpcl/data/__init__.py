"""Task streams and offline datasets for DP continual learning (layer 4; never imports torch).

Datasets (:class:`LabelledDataset`: features ``float32 [n, d]``, labels ``int64``,
``unit_ids`` = privacy unit of each example, ``class_names``, optional raw ``texts``):

* :func:`load_digits` -- scikit-learn's bundled digits, features in [0, 1].
* :func:`load_fortunes` / :func:`load_fortunes_texts` -- Debian ``fortunes`` categories as
  text classes, with (or without) MiniLM embeddings cached on disk by content hash.
* :func:`load_image_folder` -- ``root/<class>/<image>.png|jpg``.
* :func:`load_cifar` -- CIFAR-10/100 python pickled batches.
* :func:`load_idx` -- MNIST-format IDX files (Fashion-MNIST, MNIST, KMNIST, EMNIST), gzipped or not.
* :func:`load_dataset` ``(name, **options)`` with names from :data:`DATASETS`
  (``"digits"``, ``"fortunes"``, ``"fortunes_texts"``, ``"image_folder:<path>"``, ``"cifar:<path>"``,
  ``"idx:<path>"``).

``[stream] encoder = "PATH"`` (:mod:`dpcl.data.pretrained`): the features of a local Hugging Face
image model or text encoder, computed offline on the run's device and cached by content hash
(torch and transformers are imported only then).

Streams (:class:`TaskStream` of :class:`Task` ``(index, train, test, labels, permutation)``):

* :func:`class_incremental_stream` ``(dataset, tasks, seed)`` -- tasks as disjoint label groups.
* :func:`blurry_stream` ``(dataset, tasks, blurry_fraction, seed)`` -- a seeded, exact fraction of
  each task's examples carries other tasks' labels.
* :func:`permuted_stream` ``(dataset, n_tasks, seed)`` -- a fixed feature permutation per task,
  each task on its own disjoint chunk of the training split.
* :func:`build_stream` ``(section)`` / :func:`task_sizes` ``(section)`` -- from a ``[stream]`` config
  section whose keys are documented in :data:`STREAM_KEYS` (and ``docs/data.md``);
  :func:`task_sizes`, :func:`task_train_labels` and :func:`task_train_unit_ids` read labels
  and unit ids only, for ``dpcl audit``.

torch views live in :mod:`dpcl.data.torch_adapter` (``to_tensors``, ``to_tensor_dataset``);
they are imported on first use of those names.
"""

from __future__ import annotations

from typing import Any

from dpcl.data import torch_adapter
from dpcl.data.cifar import load_cifar
from dpcl.data.dataset import LabelledDataset, concatenate
from dpcl.data.digits import load_digits
from dpcl.data.fortunes import DEFAULT_FORTUNE_CATEGORIES, load_fortunes, load_fortunes_texts
from dpcl.data.idx import load_idx
from dpcl.data.image_folder import load_image_folder
from dpcl.data.registry import DATASETS, dataset_labels, load_dataset
from dpcl.data.splits import stratified_split
from dpcl.data.streams import (
    GUARANTEE_STREAM_KEYS,
    STREAM_KEYS,
    STREAM_KINDS,
    Task,
    TaskStream,
    blurry_stream,
    build_stream,
    class_incremental_stream,
    parse_stream_section,
    permuted_stream,
    task_sizes,
    task_train_labels,
    task_train_unit_ids,
)

__all__ = [
    "DATASETS",
    "DEFAULT_FORTUNE_CATEGORIES",
    "GUARANTEE_STREAM_KEYS",
    "LabelledDataset",
    "STREAM_KEYS",
    "STREAM_KINDS",
    "Task",
    "TaskStream",
    "blurry_stream",
    "build_stream",
    "class_incremental_stream",
    "concatenate",
    "dataset_labels",
    "load_cifar",
    "load_dataset",
    "load_digits",
    "load_fortunes",
    "load_fortunes_texts",
    "load_idx",
    "load_image_folder",
    "parse_stream_section",
    "permuted_stream",
    "stratified_split",
    "task_sizes",
    "task_train_labels",
    "task_train_unit_ids",
    "to_tensor_dataset",
    "to_tensors",
]

_TORCH_NAMES = {"to_tensors", "to_tensor_dataset"}


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:
        return getattr(torch_adapter, name)
    raise AttributeError(f"module 'dpcl.data' has no attribute {name!r}")
