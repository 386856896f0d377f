"""Datasets by name: ``load_dataset("digits")``, ``load_dataset("cifar:/data/cifar-10-batches-py")``.

Loaders are imported only when their dataset is asked for, so importing
:mod:`dpcl.data` stays light (no scikit-learn, Pillow, sentence-transformers or torch).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np

from dpcl.data.cifar import cifar_labels, load_cifar
from dpcl.data.dataset import LabelledDataset
from dpcl.data.digits import load_digits
from dpcl.data.fortunes import check_encoding_options, load_fortunes, load_fortunes_texts
from dpcl.data.idx import idx_labels, idx_own_test_start, load_idx
from dpcl.data.image_folder import check_image_options, image_folder_index, load_image_folder
from dpcl.errors import InvalidParameterError

__all__ = ["DATASETS", "load_dataset", "dataset_labels", "dataset_modality", "dataset_own_test_start",
           "missing_dataset_folder"]

#: Dataset names (path-based ones end in ``:<path>``) -> what they are.
DATASETS: dict[str, str] = {
    "digits": "scikit-learn's bundled 8x8 handwritten digits, 1,797 images, 10 classes (features in [0, 1]).",
    "fortunes": "Debian fortunes categories as text classes, MiniLM sentence embeddings (384-d), texts kept; "
    "options: categories, min_count, max_per_class, cache_dir.",
    "fortunes_texts": "the same fortunes as raw texts only (no embedding); options: categories, min_count, max_per_class.",
    "image_folder:<path>": "images in <path>/<class>/*.png|jpg; options: mode ('L' or 'RGB'), size [height, width].",
    "cifar:<path>": "CIFAR-10/100 python pickled batches in <path>; options: split ('all', 'train', 'test'), "
    "label_kind ('fine' or 'coarse', CIFAR-100).",
    "idx:<path>": "MNIST-format IDX files (Fashion-MNIST, MNIST, KMNIST, EMNIST; gzipped or not) in <path>: "
    "train-* and t10k-* images and labels; options: split ('all', 'train', 'test'), prefix (e.g. "
    "'emnist-balanced-'), class_names. With split 'all', [stream] holdout = \"dataset\" tests on the t10k files.",
}


def _digits(**options: Any) -> LabelledDataset:
    return load_digits(**options)


def _fortunes(**options: Any) -> LabelledDataset:
    return load_fortunes(**options)


def _fortunes_texts(**options: Any) -> LabelledDataset:
    return load_fortunes_texts(**options)


def _image_folder(path: str, **options: Any) -> LabelledDataset:
    if "size" in options and isinstance(options["size"], list):
        options = {**options, "size": tuple(options["size"])}
    return load_image_folder(path, **options)


def _cifar(path: str, **options: Any) -> LabelledDataset:
    return load_cifar(path, **options)


_LOADERS: dict[str, Callable[..., LabelledDataset]] = {
    "digits": _digits,
    "fortunes": _fortunes,
    "fortunes_texts": _fortunes_texts,
}
def _idx(path: str, **options: Any) -> LabelledDataset:
    return load_idx(path, **options)


_PATH_LOADERS: dict[str, Callable[..., LabelledDataset]] = {
    "image_folder": _image_folder, "cifar": _cifar, "idx": _idx,
}


def _resolve(name: Any) -> tuple[Callable[..., LabelledDataset], tuple[str, ...], Callable[..., Any]]:
    if not isinstance(name, str) or not name:
        raise InvalidParameterError(f"dataset must be a name from {', '.join(DATASETS)}; got {name!r}.")
    if name in _LOADERS:
        return _LOADERS[name], (), _LOADERS[name]
    prefix, sep, path = name.partition(":")
    if sep and prefix in _PATH_LOADERS:
        if not path:
            raise InvalidParameterError(f"dataset {name!r} needs a path after '{prefix}:'.")
        return _PATH_LOADERS[prefix], (path,), _PATH_LOADERS[prefix]
    raise InvalidParameterError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}.")


def _check_options(name: str, loader: Callable[..., Any], options: dict[str, Any]) -> None:
    target = {
        _digits: "dpcl.data.digits:load_digits",
        _fortunes: "dpcl.data.fortunes:load_fortunes",
        _fortunes_texts: "dpcl.data.fortunes:load_fortunes_texts",
        _image_folder: "dpcl.data.image_folder:load_image_folder",
        _cifar: "dpcl.data.cifar:load_cifar",
        _idx: "dpcl.data.idx:load_idx",
    }[loader]
    import importlib  # noqa: PLC0415

    module, attribute = target.split(":")
    signature = inspect.signature(getattr(importlib.import_module(module), attribute))
    allowed = [p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
               or (p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.name not in ("root", "path"))]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise InvalidParameterError(
            f"dataset {name!r} has no option(s) {', '.join(unknown)}; allowed: {', '.join(allowed) or 'none'}."
        )


def missing_dataset_folder(name: str) -> str | None:
    """Why the path-based dataset ``name`` (``"idx:/usr/share/datasets/fashion-mnist"``) cannot be read on this
    machine (its folder is absent, with the Debian package to install where one ships it), else None. For
    skipping a bundled config on a machine without its data; loading it would raise InvalidParameterError."""
    from pathlib import Path  # noqa: PLC0415

    prefix, sep, path = name.partition(":") if isinstance(name, str) else ("", "", "")
    if not sep or prefix not in _PATH_LOADERS or Path(path).expanduser().exists():
        return None
    hint = " (apt-get install dataset-fashion-mnist)" if Path(path).name == "fashion-mnist" else ""
    return f"dataset {name} is not on this machine{hint}"


def dataset_modality(name: str) -> str:
    """``"image"`` or ``"text"``: what the dataset ``name`` holds (for checking an encoder without loading it)."""
    loader, _, _ = _resolve(name)
    return "text" if loader in (_fortunes, _fortunes_texts) else "image"


def load_dataset(name: str, **options: Any) -> LabelledDataset:
    """The dataset ``name`` (a key of :data:`DATASETS`, path-based ones as ``"cifar:<path>"``).

    ``options`` go to the loader; an unknown option raises InvalidParameterError naming it.
    """
    loader, args, _ = _resolve(name)
    _check_options(name, loader, options)
    return loader(*args, **options)


def dataset_labels(name: str, **options: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """``(labels, unit_ids, n_classes)`` of :func:`load_dataset` ``(name, **options)``, in the same
    order, without computing features where that is costly (fortunes: no encoder; image folders:
    no decoding)."""
    loader, args, _ = _resolve(name)
    _check_options(name, loader, options)
    if loader is _fortunes or loader is _fortunes_texts:
        if loader is _fortunes:  # the encoder's options, checked although no text is encoded here
            check_encoding_options(options.get("cache_dir"), options.get("batch_size", 64))
        text_options = {k: v for k, v in options.items() if k not in ("cache_dir", "batch_size")}
        dataset = load_fortunes_texts(**text_options)
        return dataset.labels, dataset.unit_ids, dataset.n_classes
    if loader is _image_folder:
        check_image_options(options.get("mode", "L"), options.get("size"))
        class_names, _, labels = image_folder_index(args[0])
        return labels, np.arange(labels.shape[0], dtype=np.int64), len(class_names)
    if loader is _idx:
        return idx_labels(args[0], **options)
    dataset = loader(*args, **options)
    return dataset.labels, dataset.unit_ids, dataset.n_classes


def dataset_own_test_start(name: str, **options: Any) -> int | None:
    """Where the dataset's own held-out test examples start in :func:`load_dataset`'s order (its
    training examples come first), or None when it has none with these options. Equal to the loaded
    dataset's ``meta["own_test_start"]``; reads labels only (what ``dpcl audit`` needs for
    ``[stream] holdout = "dataset"``)."""
    loader, args, _ = _resolve(name)
    _check_options(name, loader, options)
    if loader is _idx:
        return idx_own_test_start(args[0], **options)
    if loader is _cifar:
        if options.get("split", "all") != "all":
            return None
        return int(cifar_labels(args[0], **{**options, "split": "train"}).size)
    return None
