"""Byte-level tokenizer for the small PeCL language model.

A byte vocabulary (256 byte values + BOS, EOS, PAD) is fixed and public: it is
not fitted on any text, so building it leaks nothing about the private tasks
(a word vocabulary built from the task stream would). No tokenizer model is
downloaded. Written by hand because the transformers byte-level BPE tokenizers
need a learned merge table (downloaded or fitted on data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dpcl.errors import InvalidParameterError


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
        n = len(raw)
        lengths = np.array([r.size for r in raw], dtype=np.int64)
        body = max_len - 2
        kept = np.minimum(lengths, body)
        ids = np.full((n, max_len), self.pad_id, dtype=np.int64)
        ids[:, 0] = self.bos_id
        if n:
            flat = np.concatenate([r[:body] for r in raw]) if kept.sum() else np.zeros(0, np.uint8)
            rows = np.repeat(np.arange(n), kept)
            cols = 1 + (np.arange(kept.sum()) - np.repeat(np.cumsum(kept) - kept, kept))
            ids[rows, cols] = flat
            ids[np.arange(n), 1 + kept] = self.eos_id
        mask = (ids != self.pad_id).astype(np.int64)
        return ids, mask

    def decode(self, ids: Sequence[int]) -> str:
        arr = np.asarray(ids, dtype=np.int64)
        arr = arr[(arr >= 0) & (arr < 256)]
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")
