"""On-disk cache of computed features, keyed by a content hash.

A cache entry is one ``.npy`` file whose name is the SHA-256 of everything the
features depend on (the encoder id and every input text). A changed text or a
different encoder gives a different key, so a stale entry is never read. Files
are written atomically (temp file + fsync + ``os.replace``) by
:func:`dpcl._io.atomic_io.write_bytes_atomic`, so a crash never leaves a
half-written entry under a valid name.

Why not ``joblib.Memory``: joblib is only an indirect dependency (through
scikit-learn, an optional extra), it keys an entry on the calling function's
source and pickled arguments rather than on what the features depend on (the
encoder weights' hash and the texts), and it does not fsync. The key here is
explicit and the write reuses dpcl's atomic writer.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Iterable

import numpy as np

from dpcl._io.atomic_io import write_bytes_atomic

__all__ = ["default_cache_dir", "content_key", "cached_array_path", "load_cached_array", "save_cached_array"]

#: Environment variable that overrides the default cache directory.
CACHE_ENV = "DPCL_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$DPCL_CACHE_DIR`` if set, else ``~/.cache/dpcl``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dpcl"


def content_key(*parts: str | Iterable[str]) -> str:
    """SHA-256 (hex) of the given strings (or iterables of strings), each length-prefixed.

    Length prefixes make the key injective: ``("ab", "c")`` and ``("a", "bc")`` differ.
    """
    digest = hashlib.sha256()
    for part in parts:
        items = [part] if isinstance(part, str) else list(part)
        digest.update(f"[{len(items)}]".encode())
        for item in items:
            data = item.encode("utf-8")
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
    return digest.hexdigest()


def cached_array_path(cache_dir: str | os.PathLike[str] | None, kind: str, key: str) -> Path:
    """Path of the cache entry ``kind``/``key``.npy under ``cache_dir`` (default :func:`default_cache_dir`)."""
    root = default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()
    return root / kind / f"{key}.npy"


def load_cached_array(path: Path, *, expected_rows: int) -> np.ndarray | None:
    """The cached array at ``path``, or None if absent or unreadable or of the wrong length."""
    try:
        array = np.load(path, allow_pickle=False)
    except (FileNotFoundError, ValueError, OSError, EOFError):
        return None
    if array.ndim != 2 or array.shape[0] != expected_rows or not np.all(np.isfinite(array)):
        return None
    return array


def save_cached_array(path: Path, array: np.ndarray) -> Path:
    """Write ``array`` to ``path`` as ``.npy``, atomically."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return write_bytes_atomic(path, buffer.getvalue())
