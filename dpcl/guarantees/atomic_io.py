"""Atomic JSON persistence for ledgers, certificates and run state.

A file is written to a temporary file in the same directory, flushed and
``fsync``-ed, then moved over the target with :func:`os.replace` (atomic on
POSIX and Windows), and the directory is ``fsync``-ed so the rename itself
survives a crash. A reader therefore sees either the old complete file or the
new complete file, never a half-written one.

The standard library has everything needed (``tempfile``, ``os.replace``); no
third-party package is required for four system calls.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from dpcl.errors import InvalidParameterError

__all__ = ["write_bytes_atomic", "write_text_atomic", "write_json_atomic", "read_json", "sha256_file"]


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + fsync + os.replace); returns the path."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)
    return target


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def _reject_non_finite(value: Any, where: str = "$") -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidParameterError(f"cannot write non-finite number {value!r} at {where} to JSON.")
    if isinstance(value, dict):
        for k, v in value.items():
            _reject_non_finite(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _reject_non_finite(v, f"{where}[{i}]")


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> Path:
    """Serialise ``obj`` as strict JSON (no NaN/inf) and write it atomically; returns the path.

    ``obj`` must already be JSON-able (dicts, lists, str, int, finite float, bool, None).
    """
    _reject_non_finite(obj)
    try:
        text = json.dumps(obj, indent=indent, sort_keys=False, allow_nan=False)
    except TypeError as exc:
        raise InvalidParameterError(f"cannot serialise to JSON: {exc}.") from exc
    return write_text_atomic(path, text + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file. Raises ``FileNotFoundError`` if absent and ``ValueError`` (json.JSONDecodeError)
    if the content is not valid JSON (e.g. truncated); callers map these to their own typed errors."""
    with open(path, "r", encoding="utf-8") as handle:
        text = handle.read()
    return json.loads(text, parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite JSON constant {name} is not allowed")


def sha256_file(path: str | os.PathLike[str], *, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()
