"""Images in a class-per-subfolder layout (``root/<class>/<image>.png|jpg|jpeg``).

Classes are the sub-folder names in sorted order (label = position); images in
each class are read in sorted file-name order. Decoding uses Pillow (a
dependency of matplotlib, so present wherever dpcl is). Each image is its own
privacy unit: unit id = position in that order. Pixels are scaled to [0, 1] and
flattened in (height, width[, channel]) order.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dpcl.data.dataset import LabelledDataset
from dpcl.errors import InvalidParameterError, MissingDependencyError

__all__ = ["IMAGE_SUFFIXES", "image_folder_index", "load_image_folder"]

#: File suffixes read as images (case-insensitive).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_MODES = {"L": 1, "RGB": 3}
#: Pillow modes with 8 bits per channel. Others (16-bit "I;16", 32-bit "I", float "F") would be clipped to
#: 0..255 by the conversion, silently changing the pixels, so they are refused.
_EIGHT_BIT_MODES = frozenset({"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"})


def image_folder_index(root: str | os.PathLike[str]) -> tuple[tuple[str, ...], list[Path], np.ndarray]:
    """``(class_names, files, labels)`` of an image folder, without decoding any image."""
    base = Path(root).expanduser()
    if not base.is_dir():
        raise InvalidParameterError(f"image folder {str(base)!r} does not exist or is not a directory.")
    class_dirs = sorted((p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.name)
    if not class_dirs:
        raise InvalidParameterError(
            f"image folder {str(base)!r} has no class sub-folders; expected root/<class>/<image>.png."
        )
    files: list[Path] = []
    counts: list[int] = []
    for class_dir in class_dirs:
        images = sorted(
            (p for p in class_dir.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES),
            key=lambda p: p.name,
        )
        files.extend(images)
        counts.append(len(images))
    if not files:
        raise InvalidParameterError(
            f"image folder {str(base)!r} holds no images with suffix {', '.join(IMAGE_SUFFIXES)}."
        )
    labels = np.repeat(np.arange(len(class_dirs), dtype=np.int64), counts)
    return tuple(p.name for p in class_dirs), files, labels


def check_image_options(mode: object, size: object) -> None:
    """Refuse a ``mode`` or ``size`` :func:`load_image_folder` cannot use (also checked by ``dpcl audit``,
    which reads only the folder index)."""
    if mode not in _MODES:
        raise InvalidParameterError(f"mode must be one of {', '.join(_MODES)}, got {mode!r}.")
    if size is not None:
        if (
            not isinstance(size, (tuple, list))
            or len(size) != 2
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in size)
        ):
            raise InvalidParameterError(f"size must be (height, width) with positive integers, got {size!r}.")


def load_image_folder(
    root: str | os.PathLike[str], *, mode: str = "L", size: tuple[int, int] | None = None
) -> LabelledDataset:
    """Images under ``root`` as a dataset.

    Args:
        root: folder with one sub-folder per class.
        mode: ``"L"`` (grey-scale, 1 channel) or ``"RGB"`` (3 channels).
        size: ``(height, width)`` to resize every image to; None requires all images to
            share one size (a mismatch raises InvalidParameterError naming the file).
    """
    check_image_options(mode, size)
    try:
        from PIL import Image  # noqa: PLC0415 - optional
    except ImportError as exc:
        raise MissingDependencyError("reading images needs Pillow; install it with `pip install pillow`.") from exc

    class_names, files, labels = image_folder_index(root)
    arrays = []
    shape = None
    for path in files:  # one decode per file: I/O bound, nothing to vectorise
        try:
            with Image.open(path) as image:
                if image.mode not in _EIGHT_BIT_MODES:
                    raise InvalidParameterError(
                        f"image {str(path)!r} has Pillow mode {image.mode!r} (not 8 bits per channel); converting it "
                        "would clip its values to 0..255. Save it as 8-bit grey-scale or RGB."
                    )
                image = image.convert(mode)
                if size is not None:
                    image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
                array = np.asarray(image, dtype=np.uint8)
        except InvalidParameterError:
            raise
        except (OSError, ValueError) as exc:
            raise InvalidParameterError(f"cannot read image {str(path)!r}: {exc}.") from exc
        if shape is None:
            shape = array.shape
        elif array.shape != shape:
            raise InvalidParameterError(
                f"image {str(path)!r} has shape {array.shape}, others {shape}; pass size=(height, width) to resize."
            )
        arrays.append(array)
    pixels = np.stack(arrays).reshape(len(arrays), -1).astype(np.float32) / np.float32(255.0)
    return LabelledDataset(
        features=pixels,
        labels=labels,
        unit_ids=np.arange(labels.shape[0], dtype=np.int64),
        name=f"image_folder:{Path(root).expanduser()}",
        class_names=class_names,
        meta={"image_shape": tuple(int(s) for s in shape), "privacy_unit": "image", "mode": mode},
    )
