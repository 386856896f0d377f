"""The public pre-trained encoder a guarantee relies on: which one it is, and what the guarantee assumes of it.

Tobaben et al. (Sec. 5, App. H) train on the features of a frozen ViT-B/16 that
was pre-trained on public data; their privacy analysis covers the task data
only, so the encoder must never have seen private data and must not be fitted
on any task's data outside the charged DP-SGD steps. A certificate therefore
names the encoder it assumes public: ``[stream] encoder = "PATH"`` is a local
Hugging Face model directory, identified by its resolved path and a SHA-256
fingerprint of its files, and :func:`public_encoder_assumption` turns that into
the sentence plans, ``dpcl audit`` and certificates state.

Nothing here imports torch or transformers: the directory is checked and
hashed with the standard library (``config.json`` and
``preprocessor_config.json`` are plain JSON), so ``dpcl audit`` validates the
encoder without loading it. The fingerprint covers every regular file under the
directory except dot-files and dot-folders (``.git``, ``.cache``), in sorted
relative-path order, each as (path, size, SHA-256); files are hashed once per
process per (size, mtime).
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from dpcl.errors import ConfigError

__all__ = [
    "PUBLIC_ENCODER_ASSUMPTION",
    "RAW_FEATURES_ASSUMPTION",
    "ENCODER_MODALITIES",
    "encoder_directory",
    "encoder_modality",
    "encoder_fingerprint",
    "public_encoder_assumption",
]

#: Stated when no encoder directory is named (raw pixels, the bundled MiniLM features).
PUBLIC_ENCODER_ASSUMPTION = (
    "The pre-trained encoder (feature extractor) was trained on public data only and is not fitted "
    "on any task's data."
)

#: Stated instead when the features are the raw inputs (digits, image folders and CIFAR without an encoder).
RAW_FEATURES_ASSUMPTION = (
    "The features are the raw inputs (pixel values scaled to [0, 1] by a fixed rule): no encoder or feature extractor "
    "is involved, and nothing is fitted on any data before the method."
)

#: What an encoder directory can hold: an image model with its image processor, or a text encoder.
ENCODER_MODALITIES = ("image", "text")

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")


def encoder_directory(path: Any) -> Path:
    """``path`` resolved, checked to be a Hugging Face model directory (``config.json`` and weights)."""
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ConfigError(f"[stream] encoder must be the path of a local Hugging Face model directory, got {path!r}.")
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise ConfigError(
            f"[stream] encoder {str(path)!r} is not a directory; give a local Hugging Face model directory "
            "(written by save_pretrained). Nothing is downloaded."
        )
    if not (folder / "config.json").is_file():
        raise ConfigError(f"[stream] encoder {str(path)!r} has no config.json; it is not a Hugging Face model directory.")
    if not any((folder / name).is_file() for name in _WEIGHT_FILES):
        raise ConfigError(
            f"[stream] encoder {str(path)!r} holds no weights ({' or '.join(_WEIGHT_FILES[::2])}); "
            "save the model with save_pretrained."
        )
    return folder


def _read_json(path: Path) -> Mapping[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"[stream] encoder: cannot read {str(path)!r} ({exc}).") from None
    if not isinstance(data, dict):
        raise ConfigError(f"[stream] encoder: {str(path)!r} is not a JSON object.")
    return data


def encoder_modality(path: Any) -> str:
    """``"image"`` (a vision config with ``image_size`` and ``num_channels``, and an image processor saved
    beside it) or ``"text"`` (a tokenizer saved beside it); anything else raises ConfigError."""
    folder = encoder_directory(path)
    config = _read_json(folder / "config.json")
    if "image_size" in config and "num_channels" in config:
        processor = folder / "preprocessor_config.json"
        if not processor.is_file():
            raise ConfigError(
                f"[stream] encoder {str(path)!r} is an image model without an image processor; save one beside it "
                "(e.g. ViTImageProcessor(...).save_pretrained(PATH)), so images are resized and normalised as in "
                "pre-training."
            )
        settings = _read_json(processor)
        if "image_mean" not in settings or "image_std" not in settings:
            raise ConfigError(f"[stream] encoder {str(path)!r}: preprocessor_config.json gives no image_mean/image_std.")
        return "image"
    if any((folder / name).is_file() for name in _TOKENIZER_FILES):
        return "text"
    raise ConfigError(
        f"[stream] encoder {str(path)!r} is neither an image model (config.json with image_size and num_channels, "
        "plus preprocessor_config.json) nor a text encoder (a tokenizer saved beside it)."
    )


@lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:  # size/mtime: re-hash when the file changes
    from dpcl.guarantees.atomic_io import sha256_file  # noqa: PLC0415

    return sha256_file(path)


def encoder_fingerprint(path: Any) -> str:
    """SHA-256 (hex) over every file of the encoder directory: sorted relative paths, sizes and file hashes."""
    folder = encoder_directory(path)
    digest = hashlib.sha256(b"dpcl-encoder-directory/v1\0")
    files = sorted(
        p for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    for file in files:  # a handful of files; each is hashed in 1 MiB chunks
        stat = file.stat()
        relative = file.relative_to(folder).as_posix()
        digest.update(f"{relative}\0{stat.st_size}\0{_file_digest(str(file), stat.st_size, stat.st_mtime_ns)}\n".encode())
    return digest.hexdigest()


def public_encoder_assumption(path: Any = None, *, raw_features: bool = False) -> str:
    """The sentence a plan states about its encoder; names the directory and its fingerprint when given.

    ``raw_features``: no encoder at all (the method sees the raw inputs), so no encoder is claimed.
    """
    if path is None:
        return RAW_FEATURES_ASSUMPTION if raw_features else PUBLIC_ENCODER_ASSUMPTION
    folder = encoder_directory(path)
    return (
        f"The pre-trained {encoder_modality(folder)} encoder at {str(folder)!r} (files sha256 "
        f"{encoder_fingerprint(folder)}) is public: its weights were trained on public data only, never on any "
        "private data, and no task's data changes them except through the charged DP-SGD steps of the method."
    )
