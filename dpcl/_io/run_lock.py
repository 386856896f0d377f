"""One live ``dpcl run`` per run directory: an advisory lock on ``DIR/run.lock``.

Two runs writing the same ledger, checkpoints and ``run.json`` would each
resume from what the other half-wrote and could release checkpoints whose
budget the other run's ledger never charged. :func:`acquire_run_lock` takes an
exclusive, non-blocking ``fcntl.flock`` on ``DIR/run.lock``; a second run on the
same directory is refused at once with :class:`RunDirectoryLockedError` (exit
code 2) naming the process that holds it. The lock belongs to the open file, so
the kernel releases it when its process ends in any way, SIGKILL included: a
lock file left by a killed run is *stale* (its recorded holder no longer holds
it) and the next run takes it over, saying so in :attr:`RunLock.took_over`.
The file records the holder (pid, host, start time) for the message; it is
emptied, never deleted, when the lock is released (deleting a lock file lets
two runs lock two different files).

``fcntl.flock`` (POSIX) is what the kernel offers for exactly this; the
``filelock`` package would add a dependency for the same system call, and
truncates the file on every attempt, which loses the holder's description. On
network file systems without ``flock`` support the lock may not be enforced.
"""

from __future__ import annotations

import contextvars
import datetime as _dt
import functools
import json
import os
import socket
from pathlib import Path
from typing import Any, Callable, TypeVar

from dpcl.errors import InvalidParameterError

__all__ = ["LOCK_NAME", "RunDirectoryLockedError", "RunLock", "acquire_run_lock", "releases_run_locks"]

LOCK_NAME = "run.lock"

F = TypeVar("F", bound=Callable[..., Any])


class RunDirectoryLockedError(InvalidParameterError):
    """Another live process holds the run directory's lock."""


class RunLock:
    """A held lock on ``directory/run.lock``; :meth:`release` (or the end of the process) frees it."""

    def __init__(self, directory: Path, fd: int, took_over: dict[str, Any] | None):
        self.directory = directory
        self.path = directory / LOCK_NAME
        self._fd: int | None = fd
        #: What the stale lock file said about the run that left it (it ended without releasing), else None.
        self.took_over = took_over

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        except OSError:  # pragma: no cover - the lock is freed by close() all the same
            pass
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:  # pragma: no cover - a lock dropped without release
        try:
            self.release()
        except Exception:
            pass


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process"
    parts = [f"pid {holder.get('pid')!r}"]
    if holder.get("host"):
        parts.append(f"on {holder['host']}")
    if holder.get("started"):
        parts.append(f"since {holder['started']}")
    return "dpcl run " + " ".join(parts)


def _read_holder(fd: int) -> dict[str, Any] | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 4096)
        holder = json.loads(data.decode("utf-8")) if data.strip() else None
    except (OSError, ValueError):
        return {"pid": "unknown"} if "data" in locals() and data.strip() else None
    return holder if isinstance(holder, dict) else None


def acquire_run_lock(directory: "str | os.PathLike[str]", *, option: str = "--out") -> RunLock:
    """Lock the run directory ``directory`` (which must exist) for this process, or refuse at once.

    Raises :class:`RunDirectoryLockedError` (exit code 2) when another live process holds it. A lock file
    left behind by a run that was killed is taken over (:attr:`RunLock.took_over` says whose it was). Inside a
    function decorated with :func:`releases_run_locks` the lock is released when that function returns or
    raises; otherwise when :meth:`RunLock.release` is called or the process ends.
    """
    import fcntl

    directory = Path(directory)
    path = directory / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as exc:
        raise InvalidParameterError(
            f"{option} {str(directory)!r}: cannot open its lock file {str(path)!r} ({exc.strerror or exc})."
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _read_holder(fd)
        os.close(fd)
        raise RunDirectoryLockedError(
            f"{option} {str(directory)!r} is in use by {_describe(holder)}: two runs must not write one run "
            "directory. Wait for that run to finish (rerunning with --resume then continues it), or give another --out."
        ) from None
    stale = _read_holder(fd)
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
    }
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(record) + "\n").encode("utf-8"))
    os.fsync(fd)
    lock = RunLock(directory, fd, stale)
    held = _SCOPE.get()
    if held is not None:
        held.append(lock)
    else:
        _PROCESS_LOCKS.append(lock)  # held until the process ends
    return lock


_SCOPE: contextvars.ContextVar[list[RunLock] | None] = contextvars.ContextVar("dpcl_run_locks", default=None)
_PROCESS_LOCKS: list[RunLock] = []


def releases_run_locks(func: F) -> F:
    """Decorator: every lock :func:`acquire_run_lock` takes during ``func`` is released when ``func`` returns or
    raises (a run that fails frees its directory at once, also inside a long-lived process such as a test)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        held: list[RunLock] = []
        token = _SCOPE.set(held)
        try:
            return func(*args, **kwargs)
        finally:
            _SCOPE.reset(token)
            for lock in held:
                lock.release()

    return wrapper  # type: ignore[return-value]
