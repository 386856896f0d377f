"""torch views of a :class:`~dpcl.data.dataset.LabelledDataset` (imports torch; the rest of dpcl.data does not)."""

from __future__ import annotations

from typing import Any

from dpcl.data.dataset import LabelledDataset
from dpcl.errors import MissingDependencyError

__all__ = ["to_tensors", "to_tensor_dataset"]


def _torch() -> Any:
    try:
        import torch  # noqa: PLC0415
    except ImportError as exc:
        raise MissingDependencyError(
            "this needs torch; install the CPU build with `pip install torch` then `pip install -e '.[train]'`."
        ) from exc
    return torch


def to_tensors(dataset: LabelledDataset, device: str = "cpu") -> tuple[Any, Any]:
    """``(features float32 [n, d], labels int64 [n])`` as torch tensors on ``device`` (no copy on CPU)."""
    torch = _torch()
    features = torch.from_numpy(dataset.features.copy()) if dataset.features is not None else None
    if features is None:
        raise MissingDependencyError(f"dataset {dataset.name!r} holds raw texts only; embed it before training.")
    labels = torch.from_numpy(dataset.labels.copy())
    return features.to(device), labels.to(device)


def to_tensor_dataset(dataset: LabelledDataset, device: str = "cpu") -> Any:
    """A ``torch.utils.data.TensorDataset`` of ``(features, labels)``."""
    torch = _torch()
    return torch.utils.data.TensorDataset(*to_tensors(dataset, device))
