"""CIFAR-10 / CIFAR-100 in their "python version" pickled-batch format, read from disk.

CIFAR-10: ``data_batch_1`` .. ``data_batch_5``, ``test_batch``, ``batches.meta``;
CIFAR-100: ``train``, ``test``, ``meta``. Each batch is a pickled dict with
``data`` (uint8 ``[n, 3072]``, channel-major 3x32x32), ``labels`` (CIFAR-10) or
``fine_labels`` / ``coarse_labels`` (CIFAR-100). Nothing is downloaded: point
the loader at the extracted folder.

Pickle can run code on load, so batches are read with a restricted unpickler
that only rebuilds dicts, lists, strings, numbers and numpy arrays; anything
else raises InvalidParameterError. Each image is its own privacy unit: its unit
id is ``split_code * 10**9 + index`` (split_code 0 = train, 1 = test), so ids are
stable whichever split is loaded.
"""

from __future__ import annotations

import io
import math
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from dpcl.data.dataset import LabelledDataset
from dpcl.errors import InvalidParameterError

__all__ = ["CIFAR_SPLITS", "find_cifar_layout", "read_cifar_batch", "load_cifar", "cifar_labels"]

CIFAR_SPLITS = ("train", "test", "all")
_UNIT_STRIDE = 10**9
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy.core.numeric", "_frombuffer"),  # arrays in protocol-5 pickles: bytes + dtype + shape, no code
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "dtype"),
    ("copy_reg", "_reconstructor"),
    ("copyreg", "_reconstructor"),
    ("builtins", "object"),
    ("_codecs", "encode"),  # how Python 3 protocol-2 pickles store bytes (a string codec, no code)
    ("__builtin__", "object"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch")


def _key(batch: dict, name: str) -> Any:
    for candidate in (name, name.encode()):
        if candidate in batch:
            return batch[candidate]
    raise KeyError(name)


def read_cifar_batch(path: str | os.PathLike[str]) -> dict[str, Any]:
    """One pickled batch as a dict with ``str`` keys; refuses anything but plain data."""
    try:
        with open(path, "rb") as handle:
            batch = _RestrictedUnpickler(io.BufferedReader(handle), encoding="bytes").load()
    except FileNotFoundError as exc:
        raise InvalidParameterError(f"CIFAR batch {str(path)!r} does not exist.") from exc
    except OSError as exc:  # a directory in its place, no permission to read...
        raise InvalidParameterError(f"CIFAR batch {str(path)!r} cannot be read: {exc.strerror or exc}.") from exc
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise InvalidParameterError(f"{str(path)!r} is not a CIFAR pickled batch: {exc}.") from exc
    if not isinstance(batch, dict):
        raise InvalidParameterError(f"{str(path)!r} is not a CIFAR pickled batch (not a dict).")
    return {(k.decode("latin-1") if isinstance(k, bytes) else str(k)): v for k, v in batch.items()}


def find_cifar_layout(path: str | os.PathLike[str]) -> tuple[str, Path, dict[str, list[str]], str]:
    """``(variant, folder, files_per_split, meta_file)`` for a CIFAR-10 or CIFAR-100 folder.

    ``path`` may be the batch folder itself or a folder containing ``cifar-10-batches-py``
    or ``cifar-100-python``.
    """
    base = Path(path).expanduser()
    for folder in (base, base / "cifar-10-batches-py", base / "cifar-100-python"):
        if (folder / "data_batch_1").is_file():
            train = sorted(
                (p.name for p in folder.glob("data_batch_*") if p.name[len("data_batch_"):].isdigit()),
                key=lambda n: int(n[len("data_batch_"):]),
            )
            return "cifar10", folder, {"train": train, "test": ["test_batch"]}, "batches.meta"
        if (folder / "train").is_file() and (folder / "test").is_file():
            return "cifar100", folder, {"train": ["train"], "test": ["test"]}, "meta"
    raise InvalidParameterError(
        f"{str(base)!r} is not a CIFAR folder: expected data_batch_1..5 + test_batch (CIFAR-10) "
        "or train + test (CIFAR-100), python pickled-batch format."
    )


#: Number of classes of each variant's label field: a label outside [0, n) means a malformed batch.
_N_CLASSES = {("cifar10", "labels"): 10, ("cifar100", "fine_labels"): 100, ("cifar100", "coarse_labels"): 20}


def _label_field(variant: str, label_kind: str) -> tuple[str, str]:
    if variant == "cifar10":
        return "labels", "label_names"
    if label_kind not in ("fine", "coarse"):
        raise InvalidParameterError(f"label_kind must be 'fine' or 'coarse' for CIFAR-100, got {label_kind!r}.")
    return f"{label_kind}_labels", f"{label_kind}_label_names"


def _batch_labels(name: str, values: Any, n_classes: int) -> np.ndarray:
    try:
        labels = np.asarray(values)
    except ValueError as exc:  # ragged nested lists
        raise InvalidParameterError(f"CIFAR batch {name!r}: labels are not a flat list of integers ({exc}).") from exc
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise InvalidParameterError(
            f"CIFAR batch {name!r}: labels must be a list of integers, got {labels.dtype} values of shape "
            f"{labels.shape}."
        )
    labels = labels.astype(np.int64).reshape(-1)
    bad = (labels < 0) | (labels >= n_classes)
    if bad.any():
        raise InvalidParameterError(
            f"CIFAR batch {name!r}: label {int(labels[bad][0])} is outside [0, {n_classes}) for this CIFAR variant."
        )
    return labels


def _batch_images(name: str, values: Any) -> np.ndarray:
    """``[n, 3 * side * side]`` uint8 pixels (3072 for CIFAR's 32 x 32); values outside 0..255, non-integers
    and rows that are not three square channels are refused, never wrapped or truncated into range."""
    try:
        data = np.asarray(values)
    except ValueError as exc:  # ragged nested lists
        raise InvalidParameterError(f"CIFAR batch {name!r}: data is not an [n, 3072] array ({exc}).") from exc
    if data.ndim < 1 or (data.size and not np.issubdtype(data.dtype, np.integer)):
        raise InvalidParameterError(
            f"CIFAR batch {name!r}: data must be uint8 pixel values, got {data.dtype} values of shape {data.shape}."
        )
    data = data.reshape(data.shape[0], -1)
    side = math.isqrt(data.shape[1] // 3)
    if data.shape[1] == 0 or data.shape[1] != 3 * side * side:
        raise InvalidParameterError(
            f"CIFAR batch {name!r}: each image must be 3 square channels (3072 = 3 x 32 x 32 values), "
            f"got rows of {data.shape[1]} values."
        )
    if data.dtype != np.uint8 and data.size and (data.min() < 0 or data.max() > 255):
        raise InvalidParameterError(
            f"CIFAR batch {name!r}: pixel values must lie in 0..255, got values in [{data.min()}, {data.max()}]."
        )
    return data.astype(np.uint8, copy=False)


def _check_split(split: str) -> tuple[str, ...]:
    if split not in CIFAR_SPLITS:
        raise InvalidParameterError(f"split must be one of {', '.join(CIFAR_SPLITS)}, got {split!r}.")
    return ("train", "test") if split == "all" else (split,)


def _read_split(
    folder: Path, files: list[str], label_field: str, n_classes: int, *, with_data: bool
) -> tuple[np.ndarray | None, np.ndarray]:
    data, labels = [], []
    for name in files:  # a handful of batch files
        batch = read_cifar_batch(folder / name)
        try:
            batch_labels = _batch_labels(name, batch[label_field], n_classes)
            if with_data:
                batch_data = _batch_images(name, batch["data"])
        except KeyError as exc:
            raise InvalidParameterError(f"CIFAR batch {name!r} lacks the field {exc.args[0]!r}.") from exc
        if with_data:
            if batch_data.shape[0] != batch_labels.shape[0]:
                raise InvalidParameterError(
                    f"CIFAR batch {name!r} has {batch_data.shape[0]} images but {batch_labels.shape[0]} labels."
                )
            data.append(batch_data)
        labels.append(batch_labels)
    if with_data and len({d.shape[1] for d in data}) > 1:
        sizes = {name: d.shape[1] for name, d in zip(files, data)}
        raise InvalidParameterError(f"CIFAR batches in {str(folder)!r} hold images of different sizes: {sizes}.")
    return (np.concatenate(data) if with_data else None), np.concatenate(labels)


def _class_names(folder: Path, meta_file: str, names_field: str, n_classes: int) -> tuple[str, ...]:
    meta_path = folder / meta_file
    if meta_path.is_file():
        names = read_cifar_batch(meta_path).get(names_field)
        if names is not None:
            if not isinstance(names, (list, tuple)):
                raise InvalidParameterError(
                    f"CIFAR meta file {str(meta_path)!r}: {names_field} must be a list of class names, "
                    f"got {type(names).__name__}."
                )
            decoded = tuple(n.decode("utf-8", errors="replace") if isinstance(n, bytes) else str(n) for n in names)
            if len(decoded) >= n_classes:
                return decoded
    return tuple(str(i) for i in range(n_classes))


def cifar_labels(path: str | os.PathLike[str], *, split: str = "all", label_kind: str = "fine") -> np.ndarray:
    """Labels of :func:`load_cifar` with the same arguments, in the same order."""
    variant, folder, files, _ = find_cifar_layout(path)
    label_field, _ = _label_field(variant, label_kind)
    n_classes = _N_CLASSES[(variant, label_field)]
    return np.concatenate(
        [_read_split(folder, files[s], label_field, n_classes, with_data=False)[1] for s in _check_split(split)]
    )


def load_cifar(path: str | os.PathLike[str], *, split: str = "all", label_kind: str = "fine") -> LabelledDataset:
    """CIFAR images as features ``float32 [n, 3072]`` in [0, 1] (channel-major 3x32x32).

    Args:
        path: the extracted CIFAR folder (see :func:`find_cifar_layout`).
        split: ``"train"``, ``"test"`` or ``"all"`` (train then test; dpcl's streams
            then make their own seeded split).
        label_kind: CIFAR-100 only: ``"fine"`` (100 classes) or ``"coarse"`` (20).
    """
    variant, folder, files, meta_file = find_cifar_layout(path)
    label_field, names_field = _label_field(variant, label_kind)
    n_classes = _N_CLASSES[(variant, label_field)]
    parts = []
    for code, split_name in enumerate(("train", "test")):
        if split_name in _check_split(split):
            data, labels = _read_split(folder, files[split_name], label_field, n_classes, with_data=True)
            parts.append((data, labels, code * _UNIT_STRIDE + np.arange(labels.shape[0], dtype=np.int64)))
    widths = sorted({p[0].shape[1] for p in parts})
    if len(widths) > 1:
        raise InvalidParameterError(f"CIFAR batches in {str(folder)!r} hold images of different sizes: {widths} values.")
    data = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    side = math.isqrt(data.shape[1] // 3)
    n_classes = int(labels.max()) + 1 if labels.size else 0
    features = data.astype(np.float32)
    features /= np.float32(255.0)
    features.setflags(write=False)  # fresh and frozen: the dataset keeps it without another copy
    meta = {"image_shape": (3, side, side), "layout": "CHW", "variant": variant, "split": split,
            "privacy_unit": "image"}
    if split == "all":  # where test_batch starts: a stream with holdout = "dataset" tests on it
        meta["own_test_start"] = int(parts[0][1].shape[0])
    return LabelledDataset(
        features=features,
        labels=labels,
        unit_ids=np.concatenate([p[2] for p in parts]),
        name=f"cifar:{Path(path).expanduser()}",
        class_names=_class_names(folder, meta_file, names_field, n_classes),
        meta=meta,
    )
