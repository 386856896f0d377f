"""In-process memos: audit, plan, ledger and certificates ask for the same epsilons (:data:`EPSILON_MEMO`), and
calibrations and ledgers rebuild the same PLDs and RDP vectors (:data:`PLD_MEMO`). Nothing is written to disk."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpcl.accounting.accountants import settings
from dpcl.accounting.accountants.base import Mechanisms

__all__ = ["EPSILON_MEMO", "PLD_MEMO", "clear_memo"]


class _PldMemo:
    """Bounded in-process LRU of PLD objects and their sizes, weighted by the grid points they hold.

    dp-accounting's PLD objects are never modified by dpcl or by composing (``compose`` and
    ``self_compose`` return new objects), so one object can serve every caller. Keys are the full
    inputs of the construction; a value derived from another PLD object (its self-composition or
    its composed size) is keyed on that object's identity and holds a reference to it, so the
    identity cannot be reused while the entry exists.
    """

    def __init__(self, max_points: float) -> None:
        import collections
        import threading

        self._data: "collections.OrderedDict[Any, tuple[Any, float]]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self._held = 0.0
        self.max_points = max_points

    def get(self, key: Any) -> Any:
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            self._data.move_to_end(key)
            return hit[0]

    def put(self, key: Any, value: Any, points: float) -> None:
        if not points <= self.max_points:
            return
        with self._lock:
            if key in self._data:
                self._held -= self._data.pop(key)[1]
            while self._data and self._held + points > self.max_points:
                self._held -= self._data.popitem(last=False)[1][1]
            self._data[key] = (value, points)
            self._held += points

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._held = 0.0


#: PLDs kept in this process (about 8 bytes a point: at most ~160 MB); cleared with :func:`clear_memo`.
PLD_MEMO = _PldMemo(2e7)


class _Memo:
    """A bounded, thread-safe, in-process LRU map from a full-input key to an immutable result.

    Nothing is ever written to disk, so nothing can go stale across versions or processes. Keys hold
    every input the computation reads (see :func:`_memo_key`); values are frozen objects, and
    :class:`AccountingResult` values are handed out as fresh copies (their ``candidates`` dict is new).
    ``hits``/``misses`` count lookups (read by the tests and benchmarks).
    """

    def __init__(self, max_entries: int) -> None:
        import collections
        import threading

        self._data: "collections.OrderedDict[Any, Any]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0

    def get(self, key: Any) -> Any:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                self.hits += 1
                return self._data[key]
            self.misses += 1
            return None

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)


#: The memo of :func:`compute_epsilon` (and of calibration's internal ``auto`` evaluations).
EPSILON_MEMO = _Memo(settings.MEMO_MAX_ENTRIES)


def _array_key(values: np.ndarray) -> tuple[Any, ...]:
    data = np.ascontiguousarray(values, dtype=np.float64)
    raw = data.tobytes()
    if len(raw) <= settings._MEMO_INLINE_BYTES:
        return (data.size, raw)
    import hashlib

    return (data.size, hashlib.sha256(raw).hexdigest())


def _mech_key(mech: Mechanisms) -> tuple[Any, ...]:
    """Canonical representation of collected events: every value the accountants read, in collection order.

    Two event lists with the same key are accounted by exactly the same computation (the accountants
    read nothing but the collected mechanisms, delta and the module settings), so they get the same result.
    """
    return (
        mech.adjacency.value,
        mech.unit,
        tuple((_array_key(m), int(c)) for m, c in zip(mech.gauss_mus, mech.gauss_counts)),
        tuple((float(e), int(c)) for e, c in mech.laplace),
        tuple((float(z), float(q), int(c)) for z, q, c in mech.sampled),
        tuple((float(e), float(d), int(c)) for e, d, c in mech.eps_delta),
    )


def clear_memo() -> None:
    """Forget every memoised epsilon and PLD (they live in this process only; see :data:`EPSILON_MEMO`)."""
    EPSILON_MEMO.clear()
    PLD_MEMO.clear()
