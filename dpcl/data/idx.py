"""Images in the IDX file format of MNIST, Fashion-MNIST, KMNIST and EMNIST, gzipped or not.

An IDX file is a 4-byte magic number ``0x00 0x00 <type> <n_dims>`` followed by
``n_dims`` big-endian ``uint32`` sizes and the data in row-major order. dpcl
reads unsigned-byte files (type ``0x08``): images ``0x00000803`` (``[n, rows,
cols]``) and labels ``0x00000801`` (``[n]``). A folder holds four files::

    <prefix>train-images-idx3-ubyte[.gz]   <prefix>train-labels-idx1-ubyte[.gz]
    <prefix>t10k-images-idx3-ubyte[.gz]    <prefix>t10k-labels-idx1-ubyte[.gz]

(``prefix`` is empty for MNIST, Fashion-MNIST and KMNIST; EMNIST names its files
``emnist-<split>-train-images-idx3-ubyte.gz``, so ``prefix = "emnist-balanced-"``).
Whether a file is gzipped is read from its first bytes, not its name.

The ``train`` files are the training split and the ``t10k`` files the held-out
test split. ``split = "all"`` (default) gives the training examples first, then
the test examples, and records where the test examples start
(``meta["own_test_start"]``), so a stream with ``holdout = "dataset"`` evaluates
on exactly the ``t10k`` files (:mod:`dpcl.data.streams`). Each image is its own
privacy unit: unit id = ``split_code * 10**9 + index`` (split_code 0 = train,
1 = t10k), stable whichever split is loaded.

Decoding is one ``np.frombuffer`` per file. Decoded files are kept in memory per
process (keyed by path, size and modification time, so a changed file is read
again): a second load in the same process, as in a sweep over seeds, costs only
the float conversion. No on-disk cache: decompressing Fashion-MNIST's 30 MB takes
about 0.4 s, less than reading back the 55 MB of decoded pixels would save.
"""

from __future__ import annotations

import gzip
import os
import zlib
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import numpy as np

from dpcl.data.dataset import LabelledDataset
from dpcl.errors import InvalidParameterError

__all__ = ["IDX_SPLITS", "IDX_IMAGES_MAGIC", "IDX_LABELS_MAGIC", "read_idx", "find_idx_files", "idx_labels",
           "idx_own_test_start", "load_idx"]

IDX_SPLITS = ("train", "test", "all")
#: Magic numbers of unsigned-byte IDX files with 3 dimensions (images) and 1 dimension (labels).
IDX_IMAGES_MAGIC = 0x00000803
IDX_LABELS_MAGIC = 0x00000801
_UNIT_STRIDE = 10**9
_FILE_STEMS = {("train", "images"): "train-images-idx3-ubyte", ("train", "labels"): "train-labels-idx1-ubyte",
               ("test", "images"): "t10k-images-idx3-ubyte", ("test", "labels"): "t10k-labels-idx1-ubyte"}


@contextmanager
def _readable(path: Path) -> Iterator[None]:
    """Turn a missing or unreadable file into InvalidParameterError naming it."""
    try:
        yield
    except FileNotFoundError as exc:
        raise InvalidParameterError(f"IDX file {str(path)!r} does not exist.") from exc
    except OSError as exc:
        raise InvalidParameterError(f"IDX file {str(path)!r} cannot be read: {exc.strerror or exc}.") from exc


def _raw_bytes(path: Path) -> bytes:
    with _readable(path):
        data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":  # gzip magic
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError; a cut-off stream, EOFError
            raise InvalidParameterError(f"IDX file {str(path)!r} is a damaged or truncated gzip file: {exc}.") from exc
    return data


@lru_cache(maxsize=8)
def _read_idx_cached(path: str, size: int, mtime_ns: int, expected_magic: int) -> np.ndarray:  # size, mtime: reread on change
    p = Path(path)
    data = _raw_bytes(p)
    kind = "images" if expected_magic == IDX_IMAGES_MAGIC else "labels"
    if len(data) < 4:
        raise InvalidParameterError(f"IDX file {path!r} is truncated: {len(data)} bytes, not even a magic number.")
    magic = int.from_bytes(data[:4], "big")
    if magic != expected_magic:
        raise InvalidParameterError(
            f"IDX file {path!r} has magic number 0x{magic:08x}; IDX {kind} files of unsigned bytes have "
            f"0x{expected_magic:08x}. Is it the {kind} file, and an IDX file at all?"
        )
    n_dims = expected_magic & 0xFF
    header = 4 + 4 * n_dims
    if len(data) < header:
        raise InvalidParameterError(f"IDX file {path!r} is truncated inside its header ({len(data)} of {header} bytes).")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=n_dims, offset=4))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "longer than its header says"
        raise InvalidParameterError(
            f"IDX file {path!r} is {what}: its header gives shape {list(dims)} ({expected} bytes in all), "
            f"the file holds {len(data)} bytes."
        )
    array = np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)
    array.setflags(write=False)
    return array


def read_idx(path: str | os.PathLike[str], expected_magic: int) -> np.ndarray:
    """The uint8 array of the IDX file at ``path`` (gzipped or not), read-only.

    ``expected_magic`` is :data:`IDX_IMAGES_MAGIC` or :data:`IDX_LABELS_MAGIC`; a file with
    another magic number, a header that does not match the file's length, or a damaged gzip
    stream raises InvalidParameterError naming the file.
    """
    p = Path(path).expanduser().resolve()
    with _readable(p):
        stat = p.stat()
    if not p.is_file():
        raise InvalidParameterError(f"IDX file {str(p)!r} is not a file.")
    return _read_idx_cached(str(p), stat.st_size, stat.st_mtime_ns, expected_magic)


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or "/" in prefix or os.sep in prefix:
        raise InvalidParameterError(f"prefix must be a file-name prefix (no '/'), got {prefix!r}.")
    return prefix


def _check_split(split: object) -> tuple[str, ...]:
    if split not in IDX_SPLITS:
        raise InvalidParameterError(f"split must be one of {', '.join(IDX_SPLITS)}, got {split!r}.")
    return ("train", "test") if split == "all" else (str(split),)


def find_idx_files(path: str | os.PathLike[str], *, prefix: str = "") -> dict[tuple[str, str], Path]:
    """The four IDX files of the folder ``path``: ``{("train" | "test", "images" | "labels"): file}``.

    Each is ``<prefix><stem>`` or ``<prefix><stem>.gz``; a missing file, or both forms present, raises
    InvalidParameterError.
    """
    prefix = _check_prefix(prefix)
    base = Path(path).expanduser()
    if not base.is_dir():
        raise InvalidParameterError(
            f"IDX folder {str(base)!r} does not exist or is not a folder; for Fashion-MNIST install the Debian "
            "package dataset-fashion-mnist (files in /usr/share/datasets/fashion-mnist)."
        )
    files = {}
    for key, stem in _FILE_STEMS.items():
        found = [base / name for name in (prefix + stem, prefix + stem + ".gz") if (base / name).exists()]
        if not found:
            raise InvalidParameterError(
                f"IDX folder {str(base)!r} lacks {prefix + stem}[.gz]; it must hold {prefix}train-images-idx3-ubyte, "
                f"{prefix}train-labels-idx1-ubyte, {prefix}t10k-images-idx3-ubyte and {prefix}t10k-labels-idx1-ubyte "
                "(each gzipped or not)" + ("" if prefix else "; set the option prefix for files named e.g. "
                                           "emnist-balanced-train-images-idx3-ubyte.gz") + "."
            )
        if len(found) > 1:
            raise InvalidParameterError(
                f"IDX folder {str(base)!r} holds both {found[0].name} and {found[1].name}; keep one of them."
            )
        files[key] = found[0]
    return files


def _labels_of(files: dict[tuple[str, str], Path], split: str) -> np.ndarray:
    return read_idx(files[(split, "labels")], IDX_LABELS_MAGIC)


def _n_classes(all_labels: dict[str, np.ndarray]) -> int:
    """Max label + 1 over the train and t10k files, so every split of a folder has the same classes."""
    return max(int(a.max()) if a.size else -1 for a in all_labels.values()) + 1


def _check_class_names(class_names: object, n_classes: int) -> tuple[str, ...]:
    if class_names is None:
        return tuple(str(i) for i in range(n_classes))
    if isinstance(class_names, (str, bytes)) or not isinstance(class_names, (list, tuple)) or not all(
        isinstance(c, str) for c in class_names
    ):
        raise InvalidParameterError(f"class_names must be a list of strings, got {class_names!r}.")
    if len(class_names) < n_classes:
        raise InvalidParameterError(
            f"class_names has {len(class_names)} names, but the labels go up to {n_classes - 1}; give at least "
            f"{n_classes} names."
        )
    return tuple(class_names)


def idx_labels(
    path: str | os.PathLike[str], *, split: str = "all", prefix: str = "", class_names: list[str] | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(labels, unit_ids, n_classes)`` of :func:`load_idx` with the same arguments, reading the label
    files alone (and the image files' headers are not checked: :func:`load_idx` does that)."""
    files = find_idx_files(path, prefix=prefix)
    all_labels = {s: _labels_of(files, s) for s in ("train", "test")}
    n_classes = len(_check_class_names(class_names, _n_classes(all_labels)))
    splits = _check_split(split)
    labels = np.concatenate([all_labels[s] for s in splits]).astype(np.int64)
    units = np.concatenate([(0 if s == "train" else 1) * _UNIT_STRIDE + np.arange(all_labels[s].size, dtype=np.int64)
                            for s in splits])
    return labels, units, n_classes


def idx_own_test_start(path: str | os.PathLike[str], *, split: str = "all", prefix: str = "",
                       class_names: list[str] | None = None) -> int | None:
    """Where the ``t10k`` examples start in :func:`load_idx`'s order (the number of training
    examples) when ``split = "all"``, else None (then the dataset has no own held-out split)."""
    del class_names  # accepted so that the loader's options can be passed unchanged
    if _check_split(split) != ("train", "test"):
        return None
    return int(_labels_of(find_idx_files(path, prefix=prefix), "train").size)


def load_idx(
    path: str | os.PathLike[str], *, split: str = "all", prefix: str = "", class_names: list[str] | None = None
) -> LabelledDataset:
    """The IDX images of the folder ``path`` as features ``float32 [n, rows * cols]`` in [0, 1].

    Args:
        path: folder with the four IDX files (see :func:`find_idx_files`).
        split: ``"all"`` (the ``train`` files, then the ``t10k`` files; a stream with
            ``holdout = "dataset"`` tests on the ``t10k`` ones), ``"train"`` or ``"test"`` (``t10k``).
        prefix: file-name prefix, e.g. ``"emnist-balanced-"`` (default none).
        class_names: a name per label (default ``"0"``, ``"1"``, ...); at least max label + 1 names.
    """
    files = find_idx_files(path, prefix=prefix)
    splits = _check_split(split)
    all_labels = {s: _labels_of(files, s) for s in ("train", "test")}
    names = _check_class_names(class_names, _n_classes(all_labels))
    images, shapes = {}, set()
    for s in ("train", "test"):  # both files' shapes are checked, so split="train" refuses a bad t10k file too
        images[s] = read_idx(files[(s, "images")], IDX_IMAGES_MAGIC)
        if images[s].shape[0] != all_labels[s].shape[0]:
            raise InvalidParameterError(
                f"IDX files {files[(s, 'images')].name} and {files[(s, 'labels')].name} in {str(Path(path))!r} do "
                f"not match: {images[s].shape[0]} images but {all_labels[s].shape[0]} labels."
            )
        shapes.add(images[s].shape[1:])
    if len(shapes) > 1:
        raise InvalidParameterError(
            f"IDX images in {str(Path(path))!r} differ in size between train and t10k: {sorted(shapes)}."
        )
    rows, cols = images["train"].shape[1:]
    pixels = np.concatenate([images[s].reshape(images[s].shape[0], -1) for s in splits])
    features = pixels.astype(np.float32)
    features /= np.float32(255.0)
    features.setflags(write=False)  # fresh and frozen: the dataset keeps it without another copy
    labels = np.concatenate([all_labels[s] for s in splits]).astype(np.int64)
    units = np.concatenate([(0 if s == "train" else 1) * _UNIT_STRIDE + np.arange(all_labels[s].size, dtype=np.int64)
                            for s in splits])
    meta = {"image_shape": (int(rows), int(cols)), "privacy_unit": "image", "split": split,
            "files": {f"{s}_{k}": p.name for (s, k), p in files.items()}}
    if split == "all":
        meta["own_test_start"] = int(all_labels["train"].size)
    return LabelledDataset(
        features=features, labels=labels, unit_ids=units, name=f"idx:{Path(path).expanduser()}",
        class_names=names, meta=meta,
    )
