"""A labelled dataset whose every example carries its privacy-unit id.

Task-wise DP (Tobaben et al., Def. 4.1) is stated per privacy unit: two tasks may
be composed in parallel (Thm 4.4) only when they hold disjoint units. Every
example therefore carries the id of the unit (person, document, example) it
belongs to, and every subset keeps those ids, so the ledger can check
disjointness instead of trusting it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from dpcl.errors import InvalidParameterError

__all__ = ["FrozenMeta", "LabelledDataset", "concatenate"]


def _frozen(array: np.ndarray) -> np.ndarray:
    """A read-only array nobody else can write: ``array`` itself if it is already read-only and
    owns its data (a fresh array frozen by this module), else a read-only copy."""
    if not array.flags.writeable and array.flags.owndata:
        return array
    array = np.array(array, copy=True)
    array.setflags(write=False)
    return array


def _fresh(array: np.ndarray | None) -> np.ndarray | None:
    """Freeze an array this module just created (fancy indexing, concatenation), to skip the copy."""
    if array is not None:
        array.setflags(write=False)
    return array


class FrozenMeta(dict):
    """A read-only dict (picklable, unlike ``types.MappingProxyType``): a dataset's ``meta``."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("dataset meta is read-only; build a new dataset with with_features(..., **meta).")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]
    __ior__ = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMeta, (dict(self),))

    def __copy__(self) -> "FrozenMeta":
        return self

    def __deepcopy__(self, memo: dict) -> "FrozenMeta":
        return self


@dataclass(frozen=True, eq=False)
class LabelledDataset:
    """Examples with labels and privacy-unit ids; immutable (arrays are read-only copies).

    Attributes:
        features: ``float32`` array ``[n, d]`` (``None`` for a raw-text dataset that has not
            been embedded; then ``texts`` is given).
        labels: ``int64`` array ``[n]``, each in ``range(len(class_names))``.
        unit_ids: ``int64`` array ``[n]``: the privacy unit of each example. Ids are unique
            per unit, so two examples with the same id belong to the same person/record.
        name: short name of the source (``"digits"``, ``"fortunes"``, ...).
        class_names: name of each label, indexed by label.
        texts: optional ``object`` array ``[n]`` of ``str`` (the raw text of each example).
        meta: free-form description (image shape, encoder id, cache file, ...).
    """

    features: np.ndarray | None
    labels: np.ndarray
    unit_ids: np.ndarray
    name: str
    class_names: tuple[str, ...]
    texts: np.ndarray | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        labels = np.asarray(self.labels)
        if labels.ndim != 1:
            raise InvalidParameterError(f"labels must be a 1-D array, got shape {labels.shape}.")
        if labels.size and not np.issubdtype(labels.dtype, np.integer):
            raise InvalidParameterError(f"labels must be integers, got dtype {labels.dtype}.")
        n = labels.shape[0]
        class_names = tuple(str(c) for c in self.class_names)
        if labels.size and (labels.min() < 0 or labels.max() >= len(class_names)):
            raise InvalidParameterError(
                f"labels must lie in [0, {len(class_names)}) (one per class name); "
                f"got values in [{labels.min()}, {labels.max()}]."
            )
        unit_ids = np.asarray(self.unit_ids)
        if unit_ids.shape != (n,) or (unit_ids.size and not np.issubdtype(unit_ids.dtype, np.integer)):
            raise InvalidParameterError(
                f"unit_ids must be an integer array of shape ({n},) (one per example), "
                f"got shape {unit_ids.shape} dtype {unit_ids.dtype}."
            )
        if self.features is None and self.texts is None:
            raise InvalidParameterError("a LabelledDataset needs features, texts, or both; got neither.")
        if self.features is not None:
            features = np.asarray(self.features, dtype=np.float32)
            if features.ndim != 2 or features.shape[0] != n:
                raise InvalidParameterError(
                    f"features must be a 2-D array [n_examples, n_features] with n_examples = {n}, "
                    f"got shape {features.shape}."
                )
            if not np.all(np.isfinite(features)):
                raise InvalidParameterError("features must be finite (no NaN or inf).")
            object.__setattr__(self, "features", _frozen(features))
        if self.texts is not None:
            texts = np.asarray(self.texts, dtype=object)
            if texts.shape != (n,):
                raise InvalidParameterError(f"texts must have shape ({n},), got {texts.shape}.")
            object.__setattr__(self, "texts", _frozen(texts))
        object.__setattr__(self, "labels", _frozen(labels.astype(np.int64, copy=False)))
        object.__setattr__(self, "unit_ids", _frozen(unit_ids.astype(np.int64, copy=False)))
        object.__setattr__(self, "class_names", class_names)
        object.__setattr__(self, "meta", self.meta if isinstance(self.meta, FrozenMeta) else FrozenMeta(self.meta))

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuild through the constructor, so an unpickled dataset is validated and read-only again
        fields = (self.features, self.labels, self.unit_ids, self.name, self.class_names, self.texts, dict(self.meta))
        return (LabelledDataset, fields)

    @property
    def n_classes(self) -> int:
        """Number of classes of the source dataset (not only those present here)."""
        return len(self.class_names)

    @property
    def n_features(self) -> int:
        """Feature dimension; raises if the dataset holds raw texts only."""
        if self.features is None:
            raise InvalidParameterError(f"dataset {self.name!r} holds raw texts only; embed it first.")
        return int(self.features.shape[1])

    def subset(self, indices: Sequence[int] | np.ndarray, *, name: str | None = None) -> "LabelledDataset":
        """The examples at ``indices`` (in that order), with their labels, unit ids and texts."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < -len(self) or idx.max() >= len(self)):
            raise InvalidParameterError(f"indices must lie in [0, {len(self)}); got [{idx.min()}, {idx.max()}].")
        return LabelledDataset(
            features=_fresh(None if self.features is None else self.features[idx]),
            labels=_fresh(self.labels[idx]),
            unit_ids=_fresh(self.unit_ids[idx]),
            name=self.name if name is None else name,
            class_names=self.class_names,
            texts=_fresh(None if self.texts is None else self.texts[idx]),
            meta=self.meta,
        )

    def with_features(self, features: np.ndarray, **meta: Any) -> "LabelledDataset":
        """The same examples with new features (e.g. permuted pixels, embeddings); meta is extended."""
        return LabelledDataset(
            features=features,
            labels=self.labels,
            unit_ids=self.unit_ids,
            name=self.name,
            class_names=self.class_names,
            texts=self.texts,
            meta={**self.meta, **meta},
        )

    def label_counts(self) -> np.ndarray:
        """Number of examples of each class, ``int64`` array ``[n_classes]``."""
        return np.bincount(self.labels, minlength=self.n_classes).astype(np.int64)

    def summary(self) -> dict[str, Any]:
        """A JSON-able description (no data)."""
        return {
            "name": self.name,
            "n_examples": len(self),
            "n_features": None if self.features is None else self.n_features,
            "n_units": int(np.unique(self.unit_ids).size),
            "class_names": list(self.class_names),
            "label_counts": self.label_counts().tolist(),
        }


def concatenate(datasets: Sequence[LabelledDataset], *, name: str | None = None) -> LabelledDataset:
    """Examples of several datasets of the same source (same classes, same feature layout), in order.

    Unit ids are kept as they are: concatenating two tasks keeps each example's unit.
    """
    if not datasets:
        raise InvalidParameterError("concatenate needs at least one dataset.")
    first = datasets[0]
    for other in datasets[1:]:
        if other.class_names != first.class_names:
            raise InvalidParameterError("datasets to concatenate must share class_names.")
        if (other.features is None) != (first.features is None) or (other.texts is None) != (first.texts is None):
            raise InvalidParameterError("datasets to concatenate must all have features (or texts) or all lack them.")
    return LabelledDataset(
        features=_fresh(None if first.features is None else np.concatenate([d.features for d in datasets], axis=0)),
        labels=_fresh(np.concatenate([d.labels for d in datasets])),
        unit_ids=_fresh(np.concatenate([d.unit_ids for d in datasets])),
        name=first.name if name is None else name,
        class_names=first.class_names,
        texts=_fresh(None if first.texts is None else np.concatenate([d.texts for d in datasets])),
        meta=first.meta,
    )
