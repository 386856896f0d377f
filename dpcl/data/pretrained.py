"""Pre-trained encoders from a local Hugging Face model directory (``[stream] encoder = "PATH"``).

Tobaben et al. (Sec. 5, App. H) classify the features of a frozen ViT-B/16
pre-trained on public data (Cosine Classifier), or train the FiLM parameters
inside that ViT (PEFT Ensemble). This module gives any image or text stream
those features, from a model the user has on disk:

* an **image model** (ViT-style: ``config.json`` with ``image_size`` and
  ``num_channels``, plus its image processor's ``preprocessor_config.json``):
  images are resized and normalised exactly as the processor says
  (:class:`PixelSettings`, one batched torch op on the device instead of the
  processor's per-image PIL loop), and the feature of an image is the ``[CLS]``
  token of the last hidden state (after the final layer norm), the pre-logits
  feature of a ViT (:func:`image_embedding`);
* a **text encoder** (a tokenizer saved beside it): texts are tokenised
  (truncated at ``min(model_max_length, 512)`` tokens) and the feature is the
  attention-masked mean of the last hidden state (sentence-transformers' mean
  pooling).

Loading goes through transformers with ``local_files_only=True`` and
``HF_HUB_OFFLINE=1`` / ``TRANSFORMERS_OFFLINE=1``: nothing is ever downloaded.
Features are computed on the requested device in batches (with a tqdm progress
bar when asked) and cached as ``.npy`` under ``$DPCL_CACHE_DIR/features/``
(:mod:`dpcl.data.cache`), keyed by the SHA-256 fingerprint of the model
directory (:func:`dpcl.guarantees.public_encoder.encoder_fingerprint`), the
device kind (cpu/cuda: float results differ slightly) and the content of the
data (the images' pixel bytes or every text), so a changed model or dataset
never reads a stale entry.

torch and transformers are imported only when features are computed or a model
is loaded; checking a directory (:func:`check_encoder_for_dataset`) reads JSON only.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from dpcl.data.cache import cached_array_path, content_key, load_cached_array, save_cached_array
from dpcl.data.dataset import LabelledDataset
from dpcl.errors import InvalidParameterError, MissingDependencyError
from dpcl.guarantees.public_encoder import (
    encoder_directory,
    encoder_fingerprint,
    encoder_modality,
    packaged_encoder,
    packaged_weights_file,
)

__all__ = [
    "ENCODER_BATCH_SIZE",
    "PixelSettings",
    "check_encoder_for_dataset",
    "image_array",
    "encoder_pixel_inputs",
    "encoder_training_inputs",
    "encode_with_encoder",
    "load_pretrained",
    "pixel_settings",
    "to_pixel_values",
    "image_embedding",
    "text_embedding",
    "text_tokens",
]

#: Examples per forward pass when computing features.
ENCODER_BATCH_SIZE = 64
_TEXT_MAX_TOKENS = 512
_INSTALL = "pip install torch==2.13.0 && pip install 'dpcl[train]'"


def _dataset_modality(dataset: LabelledDataset) -> str | None:
    if dataset.meta.get("image_shape") is not None and dataset.features is not None:
        return "image"
    if dataset.texts is not None:
        return "text"
    return None


def check_encoder_for_dataset(encoder: Any, dataset_modality: str | None) -> str:
    """The encoder's modality, checked against the data's (``"image"``, ``"text"`` or None: unknown)."""
    modality = encoder_modality(encoder)
    if dataset_modality is not None and modality != dataset_modality:
        raise InvalidParameterError(
            f"[stream] encoder {str(encoder)!r} is a {modality} encoder but dataset holds {dataset_modality}s; "
            f"give a {dataset_modality} encoder (or remove the encoder key)."
        )
    return modality


# ----------------------------------------------------------------------------------------------
# images as arrays (numpy only)


def image_array(dataset: LabelledDataset) -> np.ndarray:
    """The dataset's images as ``float32 [n, C, H, W]`` in [0, 1] (a view or copy of its pixel features).

    Layouts from the loaders' ``meta["image_shape"]``: ``(H, W)`` grey-scale (digits, image folders in
    mode L), ``(H, W, 3)`` (image folders in RGB) and ``(3, H, W)`` with ``layout = "CHW"`` (CIFAR).
    """
    shape = dataset.meta.get("image_shape")
    if shape is None or dataset.features is None:
        raise InvalidParameterError(f"dataset {dataset.name!r} holds no images (no image_shape); an image encoder needs images.")
    n = len(dataset)
    if len(shape) == 2:
        return dataset.features.reshape(n, 1, *shape)
    if len(shape) == 3 and dataset.meta.get("layout") == "CHW":
        return dataset.features.reshape(n, *shape)
    if len(shape) == 3:
        return dataset.features.reshape(n, *shape).transpose(0, 3, 1, 2)
    raise InvalidParameterError(f"dataset {dataset.name!r} has an image shape {shape} that is not 2-D or 3-D.")


def _channels_to(images: np.ndarray, channels: int, name: str) -> np.ndarray:
    have = images.shape[1]
    if have == channels:
        return images
    if have == 1:  # grey-scale into a colour model: the same value in every channel
        return np.repeat(images, channels, axis=1)
    raise InvalidParameterError(
        f"dataset {name!r} has {have}-channel images but the encoder expects {channels} channels; load the images "
        "in a matching mode (dataset_options mode = 'RGB' or 'L')."
    )


def _model_channels(encoder: Any) -> int:
    import json  # noqa: PLC0415

    if packaged_encoder(encoder) is not None:
        return 3  # the packaged encoders are RGB ImageNet models

    config = json.loads((encoder_directory(encoder) / "config.json").read_text(encoding="utf-8"))
    return int(config["num_channels"])


def encoder_training_inputs(dataset: LabelledDataset, encoder: Any) -> LabelledDataset:
    """The dataset as a method that runs the encoder itself trains on (PEFT Ensemble's ``film`` variant):
    an image encoder gets pixel rows (:func:`encoder_pixel_inputs`), a text encoder the raw texts alone
    (``features`` None: the stream is a raw-text stream, tokenised by the method with :func:`text_tokens`)."""
    _refuse_packaged_inside(encoder)
    modality = check_encoder_for_dataset(encoder, _dataset_modality(dataset))
    if modality == "image":
        return encoder_pixel_inputs(dataset, encoder)
    if dataset.texts is None:
        raise InvalidParameterError(f"dataset {dataset.name!r} holds no texts; a text encoder needs texts.")
    return LabelledDataset(
        features=None, labels=dataset.labels, unit_ids=dataset.unit_ids, name=dataset.name,
        class_names=dataset.class_names, texts=dataset.texts,
        meta={**dataset.meta, "encoder": str(encoder_directory(encoder)), "encoder_inputs": "texts"},
    )


def _refuse_packaged_inside(encoder: Any) -> None:
    if packaged_encoder(encoder) is not None:
        raise InvalidParameterError(
            f"[stream] encoder {encoder!r} is a packaged encoder: it gives features (PEFT Ensemble variant = "
            "'adapter'), nothing trains inside it; training inside an encoder needs a Hugging Face model directory."
        )


def encoder_pixel_inputs(dataset: LabelledDataset, encoder: Any) -> LabelledDataset:
    """The dataset's images as the pixel rows a method that runs the encoder itself trains on (PEFT
    Ensemble's ``film`` variant): ``float32 [n, C * S * S]`` in [0, 1], channel-major, with the encoder's
    channel count ``C``; images must be square (``S x S``). Resizing and normalisation happen on the
    device, batch by batch (:func:`to_pixel_values`)."""
    _refuse_packaged_inside(encoder)
    check_encoder_for_dataset(encoder, _dataset_modality(dataset) or "image")
    images = _channels_to(image_array(dataset), _model_channels(encoder), dataset.name)
    if images.shape[2] != images.shape[3]:
        raise InvalidParameterError(
            f"dataset {dataset.name!r} has {images.shape[2]}x{images.shape[3]} images; training inside the encoder "
            "needs square images: set dataset_options size = [S, S]."
        )
    rows = np.ascontiguousarray(images.reshape(len(dataset), -1))
    return dataset.with_features(rows, image_shape=tuple(images.shape[1:]), layout="CHW",
                                 encoder=str(encoder_directory(encoder)), encoder_inputs="pixels")


# ----------------------------------------------------------------------------------------------
# torch side (imported lazily)


def _torch() -> Any:
    try:
        import torch  # noqa: PLC0415
    except ImportError as exc:
        raise MissingDependencyError(f"a pre-trained encoder needs torch and transformers; install them with `{_INSTALL}`.") from exc
    return torch


@dataclass(frozen=True)
class PixelSettings:
    """What the encoder's image processor does to an image in [0, 1], as batched tensor operations.

    ``scale`` maps [0, 1] pixels to the processor's input range (``255 * rescale_factor`` when it
    rescales, else 255); then resize to ``height x width`` (bilinear with antialiasing, as the
    processor's PIL bilinear resampling), optional centre crop to ``crop``, and
    ``(x - mean) / std`` when it normalises.
    """

    channels: int
    height: int
    width: int
    resize: bool
    crop: tuple[int, int] | None
    scale: float
    normalize: bool
    mean: tuple[float, ...]
    std: tuple[float, ...]


def pixel_settings(encoder: Any) -> PixelSettings:
    """Read the image processor saved in ``encoder`` (transformers' ``AutoImageProcessor``, offline); a
    packaged encoder's input settings are its own (:class:`~dpcl.guarantees.public_encoder.PackagedEncoder`)."""
    packaged = packaged_encoder(encoder)
    if packaged is not None:  # images in [0, 1], resized to the square input, normalised per channel
        return PixelSettings(channels=3, height=packaged.image_size, width=packaged.image_size, resize=True, crop=None,
                             scale=1.0, normalize=True, mean=packaged.mean, std=packaged.std)
    _offline()
    from transformers import AutoImageProcessor  # noqa: PLC0415

    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    folder = encoder_directory(encoder)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # only the processor's settings are read: its backend does not matter
    try:
        processor = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    except OSError as exc:
        raise InvalidParameterError(f"[stream] encoder {str(encoder)!r}: cannot load its image processor: {exc}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    size = dict(getattr(processor, "size", None) or {})
    if "height" in size and "width" in size:
        height, width = int(size["height"]), int(size["width"])
    elif "shortest_edge" in size:  # square inputs: the shortest edge is every edge
        height = width = int(size["shortest_edge"])
    else:
        raise InvalidParameterError(f"[stream] encoder {str(encoder)!r}: image processor size {size!r} is not supported.")
    crop = None
    if getattr(processor, "do_center_crop", False):
        crop_size = dict(processor.crop_size)
        crop = (int(crop_size["height"]), int(crop_size["width"]))
    channels = _model_channels(folder)
    mean = tuple(float(v) for v in np.broadcast_to(np.asarray(processor.image_mean, dtype=float), (channels,)))
    std = tuple(float(v) for v in np.broadcast_to(np.asarray(processor.image_std, dtype=float), (channels,)))
    rescale = bool(getattr(processor, "do_rescale", True))
    return PixelSettings(
        channels=channels,
        height=height,
        width=width,
        resize=bool(getattr(processor, "do_resize", True)),
        crop=crop,
        scale=255.0 * (float(processor.rescale_factor) if rescale else 1.0),
        normalize=bool(getattr(processor, "do_normalize", True)),
        mean=mean,
        std=std,
    )


def to_pixel_values(images: Any, settings: PixelSettings) -> Any:
    """``pixel_values`` for the model from a batch ``[b, C, H, W]`` (or rows ``[b, C * S * S]``) in [0, 1]."""
    torch = _torch()
    import torch.nn.functional as F  # noqa: PLC0415, N812

    x = images
    if x.dim() == 2:
        side = math.isqrt(x.shape[1] // settings.channels)
        x = x.reshape(x.shape[0], settings.channels, side, side)
    x = x.float() * settings.scale
    if settings.resize and tuple(x.shape[2:]) != (settings.height, settings.width):
        x = F.interpolate(x, size=(settings.height, settings.width), mode="bilinear", align_corners=False, antialias=True)
    if settings.crop is not None:
        top = (x.shape[2] - settings.crop[0]) // 2
        left = (x.shape[3] - settings.crop[1]) // 2
        x = x[:, :, top : top + settings.crop[0], left : left + settings.crop[1]]
    if settings.normalize:
        mean = torch.tensor(settings.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(settings.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        x = (x - mean) / std
    return x


def image_embedding(model: Any, pixel_values: Any) -> Any:
    """The image feature: the ``[CLS]`` token of the last hidden state (the model's final layer norm
    applied), or ``pooler_output`` for models without a token sequence; for a packaged CNN encoder, the
    global average of its last feature map."""
    if getattr(model, "dpcl_pooled_features", False):
        return model.extract_features(pixel_values).mean(dim=(2, 3))
    output = model(pixel_values=pixel_values)
    hidden = getattr(output, "last_hidden_state", None)
    if hidden is not None and hidden.dim() == 3:
        return hidden[:, 0]
    return output.pooler_output.flatten(1)


def _offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def load_pretrained(encoder: Any, device: str = "cpu") -> tuple[Any, Any]:
    """``(model, tokenizer_or_None)`` from the directory, offline, in eval mode on ``device``, loaded once per process."""
    if packaged_encoder(encoder) is not None:
        return _load_packaged(str(encoder), encoder_fingerprint(encoder), str(device)), None
    folder = encoder_directory(encoder)
    return _load_cached(str(folder), encoder_fingerprint(folder), str(device))


@lru_cache(maxsize=4)
def _load_cached(folder: str, fingerprint: str, device: str) -> tuple[Any, Any]:  # fingerprint: reload on change
    torch = _torch()
    _offline()
    try:
        from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415
        from transformers.utils import logging as hf_logging  # noqa: PLC0415
    except ImportError as exc:
        raise MissingDependencyError(f"a pre-trained encoder needs transformers; install it with `{_INSTALL}`.") from exc
    bars_were_on = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()  # no load report on stderr (e.g. an unused pooler the directory lacks)
    try:
        # modules the directory holds no weights for (an unused pooler) are initialised from torch's global
        # generator: fork it, so loading an encoder never shifts the run's other randomness
        with torch.random.fork_rng(devices=[]):
            model = AutoModel.from_pretrained(folder, local_files_only=True)
        tokenizer = (
            AutoTokenizer.from_pretrained(folder, local_files_only=True) if encoder_modality(folder) == "text" else None
        )
    except OSError as exc:
        raise InvalidParameterError(f"[stream] encoder {folder!r} cannot be loaded offline: {exc}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars_were_on:
            hf_logging.enable_progress_bar()
    model.requires_grad_(False)
    return model.to(device).eval(), tokenizer


@lru_cache(maxsize=2)
def _load_packaged(spec: str, fingerprint: str, device: str) -> Any:  # fingerprint: reload on change
    """A packaged encoder built from its package's model code and the weights file (``weights_only`` load,
    every tensor required: a weights file that does not fit the architecture is refused)."""
    import importlib  # noqa: PLC0415

    torch = _torch()
    packaged = packaged_encoder(spec)
    weights = packaged_weights_file(spec)
    try:
        code = importlib.import_module(packaged.code_module)
        with torch.random.fork_rng(devices=[]):  # building the model draws initial weights: keep the run's RNG
            model = code.EfficientNet.from_name(packaged.architecture)
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True), strict=True)
    except (ImportError, AttributeError, OSError, RuntimeError) as exc:
        raise InvalidParameterError(f"[stream] encoder {spec!r} cannot be loaded: {exc}") from None
    model.requires_grad_(False)
    model.dpcl_pooled_features = True  # image_embedding: global average of the last feature map
    model.dpcl_feature_dim = packaged.feature_dim
    return model.to(device).eval()


def _batches(n: int, batch_size: int, progress: bool, unit: str):
    from tqdm.auto import tqdm  # noqa: PLC0415

    with tqdm(total=n, desc="encoding", unit=unit, disable=not progress, file=sys.stderr, leave=False) as bar:
        for start in range(0, n, batch_size):  # batches, not examples
            stop = min(n, start + batch_size)
            yield start, stop
            bar.update(stop - start)


def _encode_images(images: np.ndarray, encoder: Any, device: str, batch_size: int, progress: bool) -> np.ndarray:
    torch = _torch()
    model, _ = load_pretrained(encoder, device)
    settings = pixel_settings(encoder)
    parts = []
    with torch.no_grad():
        for start, stop in _batches(images.shape[0], batch_size, progress, "image"):
            batch = torch.tensor(images[start:stop], device=device)  # a copy: dataset arrays are read-only
            parts.append(image_embedding(model, to_pixel_values(batch, settings)).float().cpu().numpy())
    width = getattr(model, "dpcl_feature_dim", None) or int(model.config.hidden_size)
    return np.concatenate(parts) if parts else np.zeros((0, width), dtype=np.float32)


def text_tokens(tokenizer: Any, texts: Any, device: Any) -> tuple[Any, Any]:
    """``(input_ids, attention_mask)`` of ``texts`` on ``device``: padded to the longest text, truncated at
    ``min(model_max_length, 512)`` tokens (what the feature path and PEFT Ensemble's text FiLM members see)."""
    texts = [str(t) for t in texts]
    if not texts:  # an empty task or test split: no sequence (the tokenizer refuses an empty batch)
        torch = _torch()
        empty = torch.zeros((0, 0), dtype=torch.long, device=device)
        return empty, empty.clone()
    max_length = min(int(getattr(tokenizer, "model_max_length", _TEXT_MAX_TOKENS) or _TEXT_MAX_TOKENS), _TEXT_MAX_TOKENS)
    tokens = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return tokens["input_ids"].to(device), tokens["attention_mask"].to(device)


def text_embedding(model: Any, input_ids: Any, attention_mask: Any) -> Any:
    """The text feature: the attention-masked mean of the last hidden state (sentence-transformers' mean
    pooling); padding changes neither the hidden states of the real tokens nor the mean.

    Trailing columns that are padding for every text of the batch are dropped first (a batch drawn from a task
    tokenised once is padded to the task's longest text): the same features from a shorter sequence."""
    if attention_mask.numel():
        used = int(attention_mask.any(0).nonzero().max()) + 1
        input_ids, attention_mask = input_ids[:, :used], attention_mask[:, :used]
    hidden = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)


def _encode_texts(texts: list[str], encoder: Any, device: str, batch_size: int, progress: bool) -> np.ndarray:
    torch = _torch()
    model, tokenizer = load_pretrained(encoder, device)
    parts = []
    with torch.no_grad():
        for start, stop in _batches(len(texts), batch_size, progress, "text"):
            parts.append(text_embedding(model, *text_tokens(tokenizer, texts[start:stop], device)).float().cpu().numpy())
    return np.concatenate(parts) if parts else np.zeros((0, int(model.config.hidden_size)), dtype=np.float32)


def _array_digest(array: np.ndarray) -> str:
    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    digest.update(np.ascontiguousarray(array).data)
    return digest.hexdigest()


def encode_with_encoder(
    dataset: LabelledDataset,
    encoder: Any,
    *,
    device: str = "cpu",
    batch_size: int = ENCODER_BATCH_SIZE,
    progress: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> LabelledDataset:
    """The dataset with the encoder's features ``float32 [n, hidden]`` (texts kept), from the cache when possible.

    Image datasets are encoded from their pixels (:func:`image_array`), text datasets from their texts.
    ``meta`` records ``encoder`` (resolved path), ``encoder_sha256``, ``features_cache`` (``hit``,
    ``miss`` or ``unwritable``) and ``cache_file``.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidParameterError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
    modality = check_encoder_for_dataset(encoder, _dataset_modality(dataset))
    # a packaged encoder is named by its spec ("package:NAME"), a model directory by its resolved path
    folder = encoder if packaged_encoder(encoder) is not None else encoder_directory(encoder)
    fingerprint = encoder_fingerprint(folder)
    device_kind = str(device).split(":")[0]
    if modality == "image":
        images = image_array(dataset)
        data_key: Any = _array_digest(images)
    else:
        if dataset.texts is None:
            raise InvalidParameterError(f"dataset {dataset.name!r} holds no texts; a text encoder needs texts.")
        texts = [str(t) for t in dataset.texts.tolist()]
        data_key = texts
    key = content_key("pretrained-features/v1", fingerprint, modality, device_kind, data_key)
    path = cached_array_path(cache_dir, "features", f"encoder-{key}")
    features = load_cached_array(path, expected_rows=len(dataset))
    status = "hit"
    if features is None:
        status = "miss"
        if modality == "image":
            features = _encode_images(_channels_to(images, _model_channels(folder), dataset.name), folder, str(device),
                                      batch_size, progress)
        else:
            features = _encode_texts(texts, folder, str(device), batch_size, progress)
        try:
            save_cached_array(path, features)
        except OSError as exc:  # the cache only saves time
            status = "unwritable"
            warnings.warn(
                f"cannot write the features cache {str(path)!r} ({exc.strerror or exc}); the features were computed "
                "and are used, but will be computed again next time. Set $DPCL_CACHE_DIR to a writable folder.",
                stacklevel=2,
            )
    return dataset.with_features(
        features, encoder=str(folder), encoder_sha256=fingerprint, features_cache=status, cache_file=str(path),
        image_shape=None, encoded_from=modality,
    )
