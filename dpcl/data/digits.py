"""scikit-learn's bundled handwritten digits (UCI optdigits test set), offline.

1,797 grey-scale 8x8 images of the digits 0-9 shipped inside scikit-learn, so
nothing is downloaded. Pixel values 0..16 are scaled to [0, 1]. The data has no
writer ids, so each image is its own privacy unit (unit id = row index).
"""

from __future__ import annotations

import numpy as np

from dpcl.data.dataset import LabelledDataset
from dpcl.errors import MissingDependencyError

__all__ = ["load_digits"]


def load_digits() -> LabelledDataset:
    """The digits dataset: features ``float32 [1797, 64]`` in [0, 1], labels 0-9."""
    try:
        from sklearn.datasets import load_digits as _sklearn_load_digits  # noqa: PLC0415 - optional
    except ImportError as exc:
        raise MissingDependencyError(
            "the digits dataset comes with scikit-learn; install it with `pip install scikit-learn` "
            "(or `pip install -e '.[train]'`)."
        ) from exc
    bunch = _sklearn_load_digits()
    features = np.asarray(bunch.data, dtype=np.float32) / np.float32(16.0)
    labels = np.asarray(bunch.target, dtype=np.int64)
    return LabelledDataset(
        features=features,
        labels=labels,
        unit_ids=np.arange(labels.shape[0], dtype=np.int64),
        name="digits",
        class_names=tuple(str(int(c)) for c in bunch.target_names),
        meta={"image_shape": (8, 8), "privacy_unit": "image", "source": "sklearn.datasets.load_digits"},
    )
