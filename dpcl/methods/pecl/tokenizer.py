"""Tokenizers for the PeCL language model: a byte tokenizer and a local pre-trained one.

A byte vocabulary (256 byte values + BOS, EOS, PAD) is fixed and public: it is
not fitted on any text, so building it leaks nothing about the private tasks
(a word vocabulary built from the task stream would). No tokenizer model is
downloaded. Written by hand because the transformers byte-level BPE tokenizers
need a learned merge table (downloaded or fitted on data).

:class:`PretrainedTokenizer` wraps the tokenizer saved next to a pre-trained
causal LM (``[method] pretrained_path``, loaded with ``local_files_only=True``)
behind the same ``encode_batch(texts, max_len) -> (ids, mask)`` interface.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dpcl.errors import ConfigError, InvalidParameterError


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255; BOS=256, EOS=257, PAD=258."""

    bos_id: int = 256
    eos_id: int = 257
    pad_id: int = 258

    @property
    def vocab_size(self) -> int:
        return 259

    def encode_batch(self, texts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """``ids [n, max_len]`` (BOS + bytes + EOS, truncated, PAD-filled) and a 0/1 ``mask``.

        The per-text byte conversion is the only Python loop (one ``bytes``
        call per text); padding and truncation are done on arrays.
        """
        if max_len < 2:
            raise InvalidParameterError(f"max_len must be >= 2 (BOS + one token), got {max_len}.")
        raw = [np.frombuffer(str(t).encode("utf-8"), dtype=np.uint8) for t in texts]
        return pack_sequences(raw, max_len, self.bos_id, self.eos_id, self.pad_id)

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids that are not text (excluded from the task-support counts)."""
        return (self.bos_id, self.eos_id, self.pad_id)

    def decode(self, ids: Sequence[int]) -> str:
        arr = np.asarray(ids, dtype=np.int64)
        arr = arr[(arr >= 0) & (arr < 256)]
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def pack_sequences(
    token_lists: Sequence[np.ndarray], max_len: int, bos_id: int, eos_id: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """``BOS + tokens + EOS`` per row (tokens truncated to ``max_len - 2``), PAD-filled -> ``(ids, mask)``.

    The mask comes from each row's length, not from ``ids != pad_id``, so a
    tokenizer whose PAD id equals its EOS/BOS id (GPT-2 style) keeps those
    positions visible. Padding and truncation are array operations.
    """
    if max_len < 2:
        raise InvalidParameterError(f"max_len must be >= 2 (BOS + one token), got {max_len}.")
    n = len(token_lists)
    lengths = np.array([len(r) for r in token_lists], dtype=np.int64)
    kept = np.minimum(lengths, max_len - 2)
    ids = np.full((n, max_len), pad_id, dtype=np.int64)
    ids[:, 0] = bos_id
    if n:
        total = int(kept.sum())
        flat = (np.concatenate([np.asarray(r[:k], dtype=np.int64) for r, k in zip(token_lists, kept)])
                if total else np.zeros(0, np.int64))
        rows = np.repeat(np.arange(n), kept)
        cols = 1 + (np.arange(total) - np.repeat(np.cumsum(kept) - kept, kept))
        ids[rows, cols] = flat
        ids[np.arange(n), 1 + kept] = eos_id
    mask = (np.arange(max_len)[None, :] < (kept + 2)[:, None]).astype(np.int64)
    return ids, mask


class PretrainedTokenizer:
    """A Hugging Face tokenizer loaded from a local directory, behind :class:`ByteTokenizer`'s interface.

    ``encode_batch`` gives the same ``(ids, mask)`` layout as the byte
    tokenizer: ``BOS + tokens + EOS``, truncated to ``max_len`` and PAD-filled,
    mask 1 on BOS/tokens/EOS. The tokenizer's own special-token insertion is
    turned off (``add_special_tokens=False``) so that every sequence gets
    exactly one BOS and one EOS whatever the tokenizer's template.

    Missing special tokens (stated, never guessed silently): a tokenizer
    without a BOS token uses its EOS token as BOS (GPT-2's convention,
    ``<|endoftext|>`` for both); one without a PAD token pads with its EOS id
    (padded positions are masked out, so the id only fills the array). A
    tokenizer with neither BOS nor EOS is refused. No token is added, so the
    model's embedding table is used as it is.
    """

    def __init__(self, hf_tokenizer: Any, path: str = "") -> None:
        self.hf = hf_tokenizer
        self.path = path
        eos = hf_tokenizer.eos_token_id
        bos = hf_tokenizer.bos_token_id
        # a BERT-like encoder's tokenizer has no BOS/EOS: its [CLS] starts and its [SEP] ends a sequence
        cls_id = getattr(hf_tokenizer, "cls_token_id", None)
        sep_id = getattr(hf_tokenizer, "sep_token_id", None)
        cls_as_bos = bos is None and cls_id is not None
        sep_as_eos = eos is None and sep_id is not None
        bos = cls_id if cls_as_bos else bos
        eos = sep_id if sep_as_eos else eos
        if eos is None and bos is None:
            raise InvalidParameterError(
                f"pretrained_path {path!r}: the tokenizer has neither a BOS nor an EOS token (nor [CLS]/[SEP]); "
                "PeCL needs one to start and end every sequence."
            )
        self.eos_id = int(eos if eos is not None else bos)
        self.bos_id = int(bos if bos is not None else self.eos_id)
        pad = hf_tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_id)
        #: sentences describing how the special tokens were set (for records/docs)
        self.notes: tuple[str, ...] = tuple(
            note for note, missing in (
                ("no BOS token: [CLS] is used as BOS", cls_as_bos),
                ("no EOS token: [SEP] is used as EOS", sep_as_eos),
                ("no BOS token: EOS is used as BOS", bos is None),
                ("no EOS token: BOS is used as EOS", eos is None),
                ("no PAD token: padding uses the EOS id (padded positions are masked)", pad is None),
            ) if missing
        )

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can emit (base vocabulary + added tokens)."""
        return len(self.hf)

    @property
    def special_ids(self) -> tuple[int, ...]:
        return tuple(sorted({self.bos_id, self.eos_id, self.pad_id, *map(int, self.hf.all_special_ids)}))

    def encode_batch(self, texts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        if max_len < 2:
            raise InvalidParameterError(f"max_len must be >= 2 (BOS + one token), got {max_len}.")
        encoded = self.hf([str(t) for t in texts], add_special_tokens=False)["input_ids"]
        return pack_sequences([np.asarray(e, dtype=np.int64) for e in encoded], max_len,
                              self.bos_id, self.eos_id, self.pad_id)

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(np.asarray(ids, dtype=np.int64).tolist(), skip_special_tokens=True)


def load_pretrained_tokenizer(path: str) -> PretrainedTokenizer:
    """``AutoTokenizer.from_pretrained(path, local_files_only=True)`` wrapped as :class:`PretrainedTokenizer`.

    ``path`` must be an existing local directory (a hub name is refused: nothing
    is downloaded or read from a download cache).
    """
    check_pretrained_directory(path)
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"[method] pretrained_path = {path!r}: no tokenizer could be loaded from it ({exc}).") from None
    return PretrainedTokenizer(hf, path)


def check_pretrained_directory(path: str) -> None:
    """Refuse (ConfigError naming the key) a ``pretrained_path`` that is not an existing local directory."""
    if not isinstance(path, str) or not path or not os.path.isdir(path):
        raise ConfigError(
            f"[method] pretrained_path = {path!r} is not an existing local directory; give a directory written by "
            "save_pretrained (config, weights and tokenizer files), or \"\" for the small built-in model."
        )
