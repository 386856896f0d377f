"""The ``idx:`` loader (MNIST-format IDX files) and ``[stream] holdout = "dataset"``."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from dpcl.data import build_stream, load_dataset, task_sizes, task_train_labels, task_train_unit_ids
from dpcl.data.idx import load_idx, read_idx, IDX_IMAGES_MAGIC
from dpcl.data.registry import dataset_labels, dataset_own_test_start
from dpcl.errors import ConfigError, InvalidParameterError

FASHION = Path("/usr/share/datasets/fashion-mnist")


def _idx_bytes(array: np.ndarray) -> bytes:
    array = np.asarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + array.tobytes()


def _write(path: Path, array: np.ndarray, *, gz: bool) -> None:
    data = _idx_bytes(array)
    path.write_bytes(gzip.compress(data) if gz else data)


def _write_folder(root: Path, *, gz: bool, n_train: int = 12, n_test: int = 6, prefix: str = "",
                  shape: tuple[int, int] = (4, 3), seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_images": rng.integers(0, 256, size=(n_train, *shape), dtype=np.uint8),
        "train_labels": np.arange(n_train, dtype=np.uint8) % 3,
        "test_images": rng.integers(0, 256, size=(n_test, *shape), dtype=np.uint8),
        "test_labels": np.arange(n_test, dtype=np.uint8) % 3,
    }
    suffix = ".gz" if gz else ""
    _write(root / f"{prefix}train-images-idx3-ubyte{suffix}", arrays["train_images"], gz=gz)
    _write(root / f"{prefix}train-labels-idx1-ubyte{suffix}", arrays["train_labels"], gz=gz)
    _write(root / f"{prefix}t10k-images-idx3-ubyte{suffix}", arrays["test_images"], gz=gz)
    _write(root / f"{prefix}t10k-labels-idx1-ubyte{suffix}", arrays["test_labels"], gz=gz)
    return arrays


@pytest.mark.parametrize("gz", [True, False])
def test_idx_reads_pixels_labels_and_units_exactly(tmp_path: Path, gz: bool) -> None:
    arrays = _write_folder(tmp_path, gz=gz)
    ds = load_dataset(f"idx:{tmp_path}")
    expected = np.concatenate([arrays["train_images"], arrays["test_images"]]).reshape(18, 12) / 255.0
    np.testing.assert_allclose(ds.features, expected.astype(np.float32), rtol=0, atol=0)
    assert ds.features.dtype == np.float32 and 0.0 <= ds.features.min() and ds.features.max() <= 1.0
    np.testing.assert_array_equal(ds.labels, np.concatenate([arrays["train_labels"], arrays["test_labels"]]))
    assert ds.meta["own_test_start"] == 12 and ds.meta["image_shape"] == (4, 3)
    assert ds.class_names == ("0", "1", "2")
    # unit ids: unique, and the same for an example whichever split is loaded
    assert np.unique(ds.unit_ids).size == len(ds)
    train, test = load_idx(tmp_path, split="train"), load_idx(tmp_path, split="test")
    np.testing.assert_array_equal(np.concatenate([train.unit_ids, test.unit_ids]), ds.unit_ids)
    np.testing.assert_array_equal(test.features, ds.features[12:])
    assert "own_test_start" not in train.meta and "own_test_start" not in test.meta
    # the labels-only path (dpcl audit) agrees with the loader
    labels, units, n_classes = dataset_labels(f"idx:{tmp_path}")
    np.testing.assert_array_equal(labels, ds.labels)
    np.testing.assert_array_equal(units, ds.unit_ids)
    assert n_classes == 3
    assert dataset_own_test_start(f"idx:{tmp_path}") == 12
    assert dataset_own_test_start(f"idx:{tmp_path}", split="train") is None


def test_idx_prefix_and_class_names(tmp_path: Path) -> None:
    _write_folder(tmp_path, gz=True, prefix="emnist-balanced-")
    ds = load_dataset(f"idx:{tmp_path}", prefix="emnist-balanced-", class_names=["a", "b", "c"])
    assert ds.class_names == ("a", "b", "c") and len(ds) == 18
    with pytest.raises(InvalidParameterError, match="prefix"):
        load_dataset(f"idx:{tmp_path}")  # files not found without the prefix: the message names the option
    with pytest.raises(InvalidParameterError, match="at least 3 names"):
        load_dataset(f"idx:{tmp_path}", prefix="emnist-balanced-", class_names=["a"])
    with pytest.raises(InvalidParameterError, match="no option"):
        load_dataset(f"idx:{tmp_path}", prefix="emnist-balanced-", size=[2, 2])


def test_idx_rereads_a_changed_file(tmp_path: Path) -> None:
    arrays = _write_folder(tmp_path, gz=False)
    first = load_idx(tmp_path, split="train")
    assert first.features[0, 0] == np.float32(arrays["train_images"][0, 0, 0] / 255.0)
    images = arrays["train_images"].copy()
    images[0, 0, 0] = 255 - images[0, 0, 0]
    path = tmp_path / "train-images-idx3-ubyte"
    _write(path, images, gz=False)
    import os
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert load_idx(tmp_path, split="train").features[0, 0] == np.float32(images[0, 0, 0] / 255.0)


def _corrupt(tmp_path: Path, name: str, data: bytes) -> Path:
    _write_folder(tmp_path, gz=False)
    (tmp_path / name).write_bytes(data)
    return tmp_path


@pytest.mark.parametrize(
    ("name", "make", "message"),
    [
        ("train-images-idx3-ubyte", lambda b: b[:-5], "truncated"),
        ("train-images-idx3-ubyte", lambda b: b[:10], "truncated inside its header"),
        ("train-images-idx3-ubyte", lambda b: b[:2], "not even a magic number"),
        ("train-images-idx3-ubyte", lambda b: b + b"\0", "longer than its header says"),
        ("train-images-idx3-ubyte", lambda b: b"\0\0\x08\x01" + b[4:], "magic number 0x00000801"),
        ("train-labels-idx1-ubyte", lambda b: b"\0\0\x08\x03" + b[4:], "magic number 0x00000803"),
        ("t10k-images-idx3-ubyte", lambda b: gzip.compress(b)[:-12], "damaged or truncated gzip"),
    ],
)
def test_bad_idx_files_raise_typed_errors(tmp_path: Path, name: str, make, message: str) -> None:
    _write_folder(tmp_path, gz=False)
    path = tmp_path / name
    path.write_bytes(make(path.read_bytes()))
    with pytest.raises(InvalidParameterError, match=message):
        load_idx(tmp_path)


def test_idx_count_mismatch_missing_and_ambiguous_files(tmp_path: Path) -> None:
    _write_folder(tmp_path / "a", gz=True)
    _write(tmp_path / "a" / "t10k-labels-idx1-ubyte.gz", np.zeros(5, dtype=np.uint8), gz=True)
    with pytest.raises(InvalidParameterError, match="6 images but 5 labels"):
        load_idx(tmp_path / "a")
    _write_folder(tmp_path / "b", gz=True)
    (tmp_path / "b" / "t10k-images-idx3-ubyte.gz").unlink()
    with pytest.raises(InvalidParameterError, match="lacks t10k-images-idx3-ubyte"):
        load_idx(tmp_path / "b")
    _write_folder(tmp_path / "c", gz=True)
    _write_folder(tmp_path / "c", gz=False)
    with pytest.raises(InvalidParameterError, match="keep one of them"):
        load_idx(tmp_path / "c")
    with pytest.raises(InvalidParameterError, match="dataset-fashion-mnist"):
        load_idx(tmp_path / "nothing")
    _write_folder(tmp_path / "d", gz=False)
    _write(tmp_path / "d" / "t10k-images-idx3-ubyte", np.zeros((6, 5, 5), dtype=np.uint8), gz=False)
    with pytest.raises(InvalidParameterError, match="differ in size"):
        load_idx(tmp_path / "d")
    with pytest.raises(InvalidParameterError, match="split must be one of"):
        load_idx(tmp_path / "a", split="validation")
    with pytest.raises(InvalidParameterError, match="magic number"):
        read_idx(tmp_path / "d" / "train-labels-idx1-ubyte", IDX_IMAGES_MAGIC)


def _section(root: Path, **extra) -> dict:
    return {"dataset": f"idx:{root}", "tasks": [[0], [1], [2]], "holdout": "dataset", **extra}


@pytest.mark.parametrize("kind", ["class_incremental", "blurry", "permuted"])
def test_holdout_dataset_tests_on_the_t10k_files_and_trains_on_train_units_only(tmp_path: Path, kind: str) -> None:
    _write_folder(tmp_path, gz=True, n_train=30, n_test=9)
    section = _section(tmp_path, kind=kind, n_tasks=2)
    stream = build_stream(section)
    train_units = np.concatenate(stream.unit_ids())
    test_units = np.concatenate([t.test.unit_ids for t in stream])
    assert train_units.max() < 10**9 <= test_units.min()  # t10k examples are never a task's privacy unit
    assert train_units.size == 30 and np.unique(train_units).size == 30
    if kind == "permuted":
        assert all(len(t.test) == 9 for t in stream)
    else:
        assert sorted(test_units.tolist()) == list(range(10**9, 10**9 + 9))
    stream.check_disjoint_units()
    # dpcl audit's labels-only plan agrees with the built stream
    assert task_sizes(section) == stream.task_sizes()
    for planned, task in zip(task_train_unit_ids(section), stream):
        np.testing.assert_array_equal(planned, task.train.unit_ids)
    for planned, task in zip(task_train_labels(section), stream):
        np.testing.assert_array_equal(planned, task.train.labels)
    assert stream.describe()["options"]["holdout"] == "dataset"


def test_holdout_dataset_errors(tmp_path: Path) -> None:
    _write_folder(tmp_path, gz=True)
    with pytest.raises(ConfigError, match="split = 'all'"):
        build_stream(_section(tmp_path, dataset_options={"split": "train"}))
    with pytest.raises(ConfigError, match="split = 'all'"):
        task_sizes(_section(tmp_path, dataset_options={"split": "train"}))
    with pytest.raises(ConfigError, match="has none"):
        task_sizes({"dataset": "digits", "tasks": [[0, 1]], "holdout": "dataset"})
    with pytest.raises(ConfigError, match="test_fraction cannot be set"):
        build_stream(_section(tmp_path, test_fraction=0.3))
    with pytest.raises(ConfigError, match="holdout must be one of"):
        build_stream(_section(tmp_path, holdout="t10k"))
    # the default stays the stratified split over all examples
    stream = build_stream({"dataset": f"idx:{tmp_path}", "tasks": [[0], [1, 2]]})
    assert sum(len(t.train) + len(t.test) for t in stream) == 18


@pytest.mark.skipif(not FASHION.is_dir(), reason="Debian package dataset-fashion-mnist is not installed "
                    "(apt-get install dataset-fashion-mnist)")
def test_debian_fashion_mnist() -> None:
    ds = load_dataset(f"idx:{FASHION}")
    assert len(ds) == 70_000 and ds.n_features == 784 and ds.meta["image_shape"] == (28, 28)
    assert ds.meta["own_test_start"] == 60_000
    np.testing.assert_array_equal(ds.label_counts(), np.full(10, 7_000))
    assert 0.0 <= ds.features.min() and ds.features.max() == 1.0
    sizes = task_sizes({"dataset": f"idx:{FASHION}", "tasks": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]],
                        "holdout": "dataset"})
    assert sizes == [12_000] * 5


def test_missing_dataset_folder_names_the_package(tmp_path: Path) -> None:
    from dpcl.data.registry import missing_dataset_folder

    assert missing_dataset_folder("digits") is None
    assert missing_dataset_folder(f"idx:{tmp_path}") is None
    message = missing_dataset_folder(f"idx:{tmp_path}/datasets/fashion-mnist")
    assert message is not None and "apt-get install dataset-fashion-mnist" in message
    assert "apt-get" not in missing_dataset_folder(f"cifar:{tmp_path}/nothing")
