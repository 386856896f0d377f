"""Debian ``fortunes`` categories as text classes (offline, real text).

Each file ``/usr/share/games/fortunes/<category>`` holds fortunes separated by
lines containing only ``%``. A category is a class; a fortune is an example and
its own privacy unit. :func:`load_fortunes_texts` returns the raw texts (for
language models); :func:`load_fortunes` adds MiniLM sentence embeddings
(:mod:`dpcl.data.encoder`), cached on disk under a key that hashes the encoder
id and every text (:mod:`dpcl.data.cache`).

Cleaning: terminal overstrike sequences (``X\\b``) and other control characters
are removed and runs of whitespace collapse to one space. A fortune that occurs
twice in a category is kept once; a fortune that occurs in two of the chosen
categories is dropped (its label would be ambiguous and it would be one unit in
two classes). Unit ids are a 63-bit hash of the cleaned text, so the same
fortune has the same id whatever categories are chosen.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from dpcl.data.cache import cached_array_path, content_key, load_cached_array, save_cached_array
from dpcl.data.dataset import LabelledDataset
from dpcl.data.encoder import encode_texts, encoder_id
from dpcl.errors import InvalidParameterError, MissingDependencyError

__all__ = [
    "DEFAULT_FORTUNE_CATEGORIES",
    "FORTUNES_DIR_ENV",
    "fortunes_dir",
    "available_fortune_categories",
    "read_fortune_file",
    "load_fortunes_texts",
    "load_fortunes",
]

#: Ten topical categories with at least 147 distinct fortunes each (Debian ``fortunes`` 1.99);
#: with the default ``max_per_class=140`` the classes are balanced.
DEFAULT_FORTUNE_CATEGORIES: tuple[str, ...] = (
    "computers",
    "education",
    "food",
    "law",
    "love",
    "politics",
    "science",
    "sports",
    "startrek",
    "work",
)

#: Environment variable that overrides the fortunes directory.
FORTUNES_DIR_ENV = "DPCL_FORTUNES_DIR"
_SYSTEM_DIR = Path("/usr/share/games/fortunes")
_INSTALL = "apt-get install fortunes"

_SEPARATOR = re.compile(r"^%[ \t]*$", flags=re.MULTILINE)
_OVERSTRIKE = re.compile(r".\x08")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def fortunes_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The fortunes directory: ``path``, else ``$DPCL_FORTUNES_DIR``, else ``/usr/share/games/fortunes``."""
    chosen = Path(path) if path is not None else Path(os.environ.get(FORTUNES_DIR_ENV, _SYSTEM_DIR))
    if not chosen.is_dir():
        raise MissingDependencyError(
            f"the Debian fortunes data is not installed (no directory {chosen}); install it with "
            f"`{_INSTALL}` (as root or with sudo), or point ${FORTUNES_DIR_ENV} at a fortunes directory."
        )
    return chosen


def available_fortune_categories(path: str | os.PathLike[str] | None = None) -> tuple[str, ...]:
    """Category names present in the fortunes directory (files without ``.dat``/``.u8`` suffix)."""
    root = fortunes_dir(path)
    return tuple(
        sorted(p.name for p in root.iterdir() if p.is_file() and "." not in p.name)
    )


def read_fortune_file(path: str | os.PathLike[str]) -> list[str]:
    """Cleaned, non-empty fortunes of one file, in file order (duplicates kept)."""
    raw = Path(path).read_text(encoding="utf-8", errors="replace")
    raw = _CONTROL.sub(" ", _OVERSTRIKE.sub("", raw))  # whole-file passes; newlines and tabs survive
    # per-fortune whitespace collapse: string work numpy cannot do
    return [t for t in (" ".join(chunk.split()) for chunk in _SEPARATOR.split(raw)) if t]


def _unit_id(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") >> 1


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise InvalidParameterError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return int(value)


def load_fortunes_texts(
    categories: Sequence[str] | None = None,
    *,
    min_count: int = 50,
    max_per_class: int | None = 140,
    fortunes_path: str | os.PathLike[str] | None = None,
) -> LabelledDataset:
    """Raw fortunes of ``categories`` (label = position in ``categories``), ``features`` None.

    Args:
        categories: category file names; None means :data:`DEFAULT_FORTUNE_CATEGORIES`.
        min_count: a category with fewer distinct fortunes is refused (InvalidParameterError).
        max_per_class: keep at most this many fortunes per category, chosen by smallest
            content hash (deterministic, independent of file order); None keeps all.
        fortunes_path: directory of the fortune files (default: see :func:`fortunes_dir`).
    """
    root = fortunes_dir(fortunes_path)
    if isinstance(categories, str):  # tuple("law") would be ('l', 'a', 'w')
        raise InvalidParameterError(
            f"categories must be a list of fortune category names, got the string {categories!r}; "
            f"write [{categories!r}] for one category."
        )
    categories = DEFAULT_FORTUNE_CATEGORIES if categories is None else tuple(categories)
    if len(categories) < 1:
        raise InvalidParameterError("categories must be a non-empty list of fortune category names.")
    if len(set(categories)) != len(categories):
        raise InvalidParameterError(f"categories must be distinct, got {list(categories)}.")
    min_count = _check_int("min_count", min_count, 1)
    if max_per_class is not None:
        max_per_class = _check_int("max_per_class", max_per_class, 1)
    available = available_fortune_categories(root)
    unknown = [c for c in categories if c not in available]
    if unknown:
        raise InvalidParameterError(
            f"unknown fortune categories {unknown}; available in {root}: {', '.join(available)}."
        )

    per_category = [read_fortune_file(root / c) for c in categories]
    texts = np.array([t for group in per_category for t in group], dtype=object)
    labels = np.repeat(np.arange(len(categories), dtype=np.int64), [len(g) for g in per_category])
    # one hash per text (hashlib has no vectorised form); all de-duplication then runs on int64 ids
    unit_ids = np.fromiter((_unit_id(t) for t in texts), dtype=np.int64, count=texts.size)
    if len(set(texts.tolist())) != np.unique(unit_ids).size:  # pragma: no cover - a 63-bit hash collision
        raise InvalidParameterError("two distinct fortunes hash to the same unit id; report this input.")
    # a fortune repeated within a category is kept once (first occurrence)
    _, first = np.unique(np.stack([labels, unit_ids], axis=1), axis=0, return_index=True)
    first = np.sort(first)
    texts, labels, unit_ids = texts[first], labels[first], unit_ids[first]
    # a fortune in more than one chosen category is dropped
    _, inverse, counts = np.unique(unit_ids, return_inverse=True, return_counts=True)
    keep = counts[inverse] == 1
    texts, labels, unit_ids = texts[keep], labels[keep], unit_ids[keep]
    class_counts = np.bincount(labels, minlength=len(categories))
    too_small = [f"{c} ({n})" for c, n in zip(categories, class_counts) if n < min_count]
    if too_small:
        raise InvalidParameterError(
            f"fortune categories with fewer than min_count={min_count} distinct fortunes: "
            f"{', '.join(too_small)}; choose other categories or lower min_count."
        )
    order = np.lexsort((unit_ids, labels))
    texts, labels, unit_ids = texts[order], labels[order], unit_ids[order]
    if max_per_class is not None:
        starts = np.concatenate([[0], np.cumsum(class_counts)[:-1]])
        rank = np.arange(labels.size) - starts[labels]
        keep = rank < max_per_class
        texts, labels, unit_ids = texts[keep], labels[keep], unit_ids[keep]
    return LabelledDataset(
        features=None,
        labels=labels,
        unit_ids=unit_ids,
        name="fortunes",
        class_names=categories,
        texts=texts,
        meta={
            "source": str(root),
            "privacy_unit": "fortune",
            "min_count": min_count,
            "max_per_class": max_per_class,
        },
    )


def check_encoding_options(cache_dir: object, batch_size: object) -> int:
    """Refuse a ``cache_dir`` or ``batch_size`` :func:`load_fortunes` cannot use (also checked by ``dpcl audit``,
    which reads only the texts); returns the batch size."""
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise InvalidParameterError(f"cache_dir must be a folder path, got {cache_dir!r}.")
    if cache_dir is not None and Path(cache_dir).expanduser().exists() and not Path(cache_dir).expanduser().is_dir():
        raise InvalidParameterError(f"cache_dir {str(cache_dir)!r} exists and is not a folder; give a folder path.")
    return _check_int("batch_size", batch_size, 1)


def load_fortunes(
    categories: Sequence[str] | None = None,
    *,
    min_count: int = 50,
    max_per_class: int | None = 140,
    cache_dir: str | os.PathLike[str] | None = None,
    fortunes_path: str | os.PathLike[str] | None = None,
    batch_size: int = 64,
) -> LabelledDataset:
    """Fortunes as :func:`load_fortunes_texts`, with MiniLM features ``[n, 384]`` (texts kept).

    Features are read from the cache (``cache_dir``, default ``$DPCL_CACHE_DIR`` or
    ``~/.cache/dpcl``) when an entry with the same encoder id and texts exists;
    otherwise they are computed once and written atomically. ``meta["features_cache"]``
    says ``"hit"``, ``"miss"`` or ``"unwritable"`` (computed, the cache could not be written: a warning
    says so) and ``meta["cache_file"]`` where the entry is.
    """
    batch_size = check_encoding_options(cache_dir, batch_size)
    texts = load_fortunes_texts(
        categories, min_count=min_count, max_per_class=max_per_class, fortunes_path=fortunes_path
    )
    model = encoder_id()
    key = content_key("minilm-features/v1", model, texts.texts.tolist())
    path = cached_array_path(cache_dir, "features", f"fortunes-{key}")
    features = load_cached_array(path, expected_rows=len(texts))
    status = "hit"
    if features is None:
        status = "miss"
        features = encode_texts(texts.texts.tolist(), batch_size=batch_size)
        try:
            save_cached_array(path, features)
        except OSError as exc:  # the cache only saves time: go on with the computed features, and say so
            status = "unwritable"
            warnings.warn(
                f"cannot write the features cache {str(path)!r} ({exc.strerror or exc}); the features were computed "
                "and are used, but will be computed again next time. Set $DPCL_CACHE_DIR or the dataset option "
                "cache_dir to a writable folder.",
                stacklevel=2,
            )
    return texts.with_features(features, encoder=model, features_cache=status, cache_file=str(path))
