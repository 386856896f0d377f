"""Checkpoints of released models: written atomically, read back only when their hash is certified.

A checkpoint is ``torch.save`` of a plain dict (format tag, method name, task
index, the method's :meth:`~dpcl.methods.base.ContinualMethod.state_dict`). It is
serialised to memory and written with
:func:`dpcl._io.atomic_io.write_bytes_atomic` (temp file + fsync +
``os.replace``), so a crash never leaves a half-written checkpoint. Loading uses
``torch.load(weights_only=True)`` (tensors and plain containers only) and
first compares the file's SHA-256 with the one its certificate records.

A checkpoint is the *release* a certificate covers. What a method needs to
continue the stream but the DP guarantee does not cover (privacy-unit ids, raw
statistics: :meth:`~dpcl.methods.base.ContinualMethod.curator_state_dict`) is
written by :func:`save_curator_state` to a separate file under ``DIR/curator/``
(private, curator-side like the ledger) and read back by
:func:`load_curator_state` only when its SHA-256 matches the one ``run.json``
records; a missing or altered file raises
:class:`~dpcl.errors.LedgerCorruptError` (never a silent reset).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Mapping

import torch

from dpcl.errors import InvalidParameterError, LedgerCorruptError, VerificationError
from dpcl._io.atomic_io import sha256_file, write_bytes_atomic

CHECKPOINT_FORMAT = "dpcl-checkpoint"
CHECKPOINT_VERSION = 1
CURATOR_STATE_FORMAT = "dpcl-curator-state"
CURATOR_STATE_VERSION = 1


def _load_failure(exc: BaseException) -> str:
    """One line saying why ``torch.load(weights_only=True)`` refused a file (torch's own message spans many lines
    and suggests allow-listing the refused global, which is exactly what must not be done with a hostile file)."""
    import pickle

    if isinstance(exc, pickle.UnpicklingError):
        first = next((line.strip() for line in str(exc).splitlines() if "Unsupported global" in line), "")
        refused = f" ({first.split(':', 1)[1].strip().split(' was ')[0]})" if ":" in first else ""
        return (
            f"it holds Python objects other than tensors and plain containers{refused}, which could run code when "
            "loaded; dpcl loads only with weights_only=True and did not unpickle them (it is not a file dpcl wrote: "
            "do not load it elsewhere either)"
        )
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


def save_checkpoint(path: "str | os.PathLike[str]", *, method: str, task_index: int, state: Mapping[str, Any],
                    meta: Mapping[str, Any] | None = None) -> str:
    """Write the checkpoint atomically; returns its SHA-256."""
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "method": str(method),
        "task_index": int(task_index),
        "state": dict(state),
        "meta": dict(meta or {}),
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    target = write_bytes_atomic(path, buffer.getvalue())
    return sha256_file(target)


def load_checkpoint(path: "str | os.PathLike[str]", *, expected_sha256: str | None = None) -> dict[str, Any]:
    """Read a checkpoint; with ``expected_sha256`` a file that hashes differently raises VerificationError."""
    p = Path(path)
    if not p.is_file():
        raise InvalidParameterError(f"checkpoint {str(p)!r} does not exist.")
    if expected_sha256 is not None:
        digest = sha256_file(p)
        if digest != expected_sha256:
            raise VerificationError(
                f"checkpoint {str(p)!r} hashes to {digest} but its certificate records {expected_sha256}: "
                "it was modified after release; refusing to resume from it."
            )
    try:
        payload = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several unrelated types for a damaged file
        raise InvalidParameterError(f"checkpoint {str(p)!r} cannot be read: {_load_failure(exc)}") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise InvalidParameterError(f"{str(p)!r} is not a dpcl checkpoint.")
    if payload.get("version") != CHECKPOINT_VERSION:
        raise InvalidParameterError(f"checkpoint version {payload.get('version')!r} is not supported.")
    return payload


def save_curator_state(path: "str | os.PathLike[str]", *, method: str, task_index: int,
                       state: Mapping[str, Any]) -> str:
    """Write a method's curator state (private, never published) atomically; returns its SHA-256."""
    payload = {
        "format": CURATOR_STATE_FORMAT,
        "version": CURATOR_STATE_VERSION,
        "method": str(method),
        "task_index": int(task_index),
        "state": dict(state),
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    target = write_bytes_atomic(path, buffer.getvalue())
    return sha256_file(target)


def load_curator_state(path: "str | os.PathLike[str]", *, expected_sha256: str, method: str,
                       task_index: int) -> dict[str, Any]:
    """Read the curator state ``run.json`` records for release ``task_index``; refuse a missing or altered file.

    Raises :class:`~dpcl.errors.LedgerCorruptError` (exit code 2) naming the
    file: a resumed run never continues without the state it recorded (the
    disjointness and fixed-memory checks would silently start from nothing).
    """
    p = Path(path)
    remedy = (
        "restore it from the run's backup (DIR/curator/ is private, curator-side state, like the ledger), "
        "or start the run over in a new directory."
    )
    if not p.is_file():
        raise LedgerCorruptError(
            f"curator state {str(p)!r} of the release of task {task_index + 1} is missing: resuming without it "
            f"would continue the stream without the state it recorded; {remedy}"
        )
    digest = sha256_file(p)
    if digest != expected_sha256:
        raise LedgerCorruptError(
            f"curator state {str(p)!r} hashes to {digest} but run.json records {expected_sha256}: it was modified "
            f"after the release of task {task_index + 1}; {remedy}"
        )
    try:
        payload = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several unrelated types for a damaged file
        raise LedgerCorruptError(f"curator state {str(p)!r} cannot be read ({_load_failure(exc)}); {remedy}") from None
    if (not isinstance(payload, dict) or payload.get("format") != CURATOR_STATE_FORMAT
            or payload.get("version") != CURATOR_STATE_VERSION):
        raise LedgerCorruptError(f"{str(p)!r} is not a dpcl curator state of version {CURATOR_STATE_VERSION}; {remedy}")
    if payload.get("method") != method or payload.get("task_index") != task_index:
        raise LedgerCorruptError(
            f"curator state {str(p)!r} was written by method {payload.get('method')!r} for task index "
            f"{payload.get('task_index')!r}, not by {method!r} for task index {task_index}; {remedy}"
        )
    return payload
