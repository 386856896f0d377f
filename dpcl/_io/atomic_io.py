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

import contextlib
import gc
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from dpcl.errors import InvalidParameterError

__all__ = [
    "append_bytes_durably",
    "parse_json",
    "write_bytes_atomic",
    "write_text_atomic",
    "write_json_atomic",
    "read_json",
    "read_bytes_limited",
    "sha256_file",
    "FileTooLargeError",
    "JsonLimitError",
    "check_nesting",
    "collector_paused",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
]

#: Largest JSON file :func:`read_json` parses (ledgers, certificates, run state). A certificate of a
#: thousand-task run is well under 1 MiB; parsed JSON takes up to about 25 times its size in memory, so this
#: keeps a hostile file far below 2 GB.
MAX_JSON_BYTES = 16 * 1024 * 1024
#: Deepest nesting of arrays and objects :func:`read_json` accepts (dpcl's own files nest fewer than 10 levels).
MAX_JSON_DEPTH = 64


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


def write_bytes_atomic(
    path: str | os.PathLike[str], data: bytes, *, mode: int | None = None, overwrite: bool = True
) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + fsync + os.replace); returns the path.

    ``mode`` sets the file's permission bits before any byte is written (e.g. ``0o600`` for a private key;
    default: those of :func:`tempfile.mkstemp`, owner read/write). ``overwrite=False`` moves the file into
    place with :func:`os.link`, which fails with :class:`FileExistsError` when ``path`` exists (no window in
    which another writer's file is replaced).
    """
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if overwrite:
            os.replace(tmp_name, target)
        else:
            try:
                os.link(tmp_name, target)
            except FileExistsError as exc:
                exc.filename = str(target)
                raise
            os.unlink(tmp_name)
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


class FileTooLargeError(ValueError):
    """A file is larger than the reader accepts; the message names the limit (a ``ValueError``, so callers that
    map unreadable content to their typed errors refuse it the same way)."""


class JsonLimitError(ValueError):
    """JSON nested deeper than :data:`MAX_JSON_DEPTH`, or holding a duplicate key."""


def read_bytes_limited(path: str | os.PathLike[str], max_bytes: int, what: str = "file") -> bytes:
    """The bytes of ``path``, refusing (:class:`FileTooLargeError`) a file of more than ``max_bytes``.

    The size is checked before reading and again while reading (a file that grows, or a device that never
    ends, is not read past the limit). A directory raises :class:`IsADirectoryError`.
    """
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        data = b"" if size > max_bytes else handle.read(max_bytes + 1)
    if size > max_bytes or len(data) > max_bytes:
        raise FileTooLargeError(
            f"{what} {str(path)!r} is {max(size, len(data))} bytes or more; dpcl reads at most {max_bytes} bytes "
            f"({max_bytes / 2**20:g} MiB) from it; a file this large is not one dpcl wrote (check where it came from)"
        )
    return data


def read_json(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """Read a JSON file. Raises ``FileNotFoundError`` if absent and ``ValueError`` (json.JSONDecodeError)
    if the content is not valid JSON (e.g. truncated); callers map these to their own typed errors.

    Hostile files are refused with a ``ValueError`` naming the limit before they can exhaust memory or the
    stack: more than ``max_bytes`` bytes (:class:`FileTooLargeError`, checked before parsing), arrays and
    objects nested deeper than ``max_depth``, a key repeated in one object (readers that keep the first or the
    last value would see different files), and NaN/Infinity.
    """
    raw = read_bytes_limited(path, max_bytes, "JSON file")
    return parse_json(raw.decode("utf-8"), max_depth=max_depth)


def parse_json(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON text as :func:`read_json` does (no duplicate keys, no NaN/Infinity, at most ``max_depth``
    levels); invalid text raises ``ValueError``."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicate_keys)
    except RecursionError:
        raise JsonLimitError(f"arrays or objects are nested deeper than {max_depth} levels") from None
    check_nesting(value, max_depth)
    return value


def append_bytes_durably(path: str | os.PathLike[str], data: bytes, *, keep: int | None = None) -> int:
    """Append ``data`` to ``path`` (created if absent) in one write, ``fsync`` it (and the directory when the file
    is new), and return the file's new size. ``keep`` first cuts the file to its first ``keep`` bytes (the
    complete records: a torn tail a reader dropped or a failed write left), so that the appended bytes follow the
    last complete record.

    A crash may leave a prefix of ``data`` at the end of the file (never a byte of it elsewhere): records that end
    with a newline and hold none inside let a reader recognise such a torn tail and drop it."""
    target = Path(path)
    new = not target.exists()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        if keep is not None:
            os.ftruncate(fd, keep)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if new:
        _fsync_directory(target.parent if str(target.parent) else Path("."))
    return size


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite JSON constant {name} is not allowed")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise JsonLimitError(f"key {duplicate[:80]!r} appears twice in one object")
    return result


def check_nesting(value: Any, max_depth: int) -> None:
    """Refuse dicts and lists nested deeper than ``max_depth`` with :class:`JsonLimitError` (iterative: a deep
    value cannot exhaust the stack here, nor later in code that walks it recursively)."""
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            raise JsonLimitError(f"arrays or objects are nested deeper than {max_depth} levels")
        children = []
        for item in level:
            for child in item.values() if isinstance(item, dict) else item:
                if isinstance(child, (dict, list)):
                    children.append(child)
        level = children


def sha256_file(path: str | os.PathLike[str], *, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a large file's objects are built (restored after, as found).

    Parsing a ledger or certificate of 10^4 tasks creates some 10^5 containers that live until the caller is done;
    the collector would walk all of them several times (a third of a verification's time) and free none of them.
    They hold no reference cycles, so reference counting frees them as before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
