"""Charges: the events charged to the data of some tasks before training on it, and their compact JSON form.

A run of equal events in one charge is one :class:`~dpcl.accounting.events.RepeatedEvent`
(:func:`compress_events`); a run of equal consecutive charges is one list entry with ``"repeat": n``
(:func:`charges_to_list`), read back as :class:`ChargeRuns` that know their runs; runs of consecutive
indices are written ``[first, last]`` (:func:`compact_indices`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from dpcl.accounting.events import PrivacyEvent, RepeatedEvent, event_from_dict
from dpcl.errors import InvalidParameterError

#: Most charges a ledger or certificate may expand its ``repeat`` counts to (a reference each in memory).
MAX_CHARGES = 10**7


@dataclass(frozen=True)
class Charge:
    """Events that read the data of ``tasks`` (0-based task indices), charged before training."""

    tasks: tuple[int, ...]
    events: tuple[PrivacyEvent, ...]
    label: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"tasks": list(self.tasks), "label": self.label, "events": [e.to_dict() for e in self.events]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], parsed: "dict[str, tuple[PrivacyEvent, ...]] | None" = None) -> "Charge":
        """The charge of :meth:`to_dict` output. ``parsed`` (a dict kept by the caller across entries) maps the JSON
        text of an ``events`` list to its parsed events, so that entries with the same events (equal-size tasks)
        parse and validate them once and share them: events are immutable, and equal JSON gives equal events."""
        tasks = tuple(int(t) for t in data["tasks"])
        raw = data["events"]
        key = None
        if parsed is not None:
            try:
                key = json.dumps(raw, allow_nan=False)
            except (TypeError, ValueError):  # not plain JSON: parsed on its own
                key = None
        events = parsed.get(key) if key is not None else None
        if events is None:
            events = tuple(event_from_dict(e) for e in raw)
            if key is not None:
                parsed[key] = events
        return cls(tasks=tasks, events=events, label=str(data.get("label", "")))


def compact_indices(values: Sequence[int]) -> list[Any]:
    """``values`` (increasing indices) with every run of three or more consecutive integers as ``[first, last]``:
    the charges of a task charged 100 times in a row are ``[[k, k + 99]]``, not 100 numbers."""
    out: list[Any] = []
    i, n = 0, len(values)
    while i < n:
        j = i
        while j + 1 < n and values[j + 1] == values[j] + 1:
            j += 1
        if j - i >= 2:
            out.append([int(values[i]), int(values[j])])
        else:
            out.extend(int(v) for v in values[i : j + 1])
        i = j + 1
    return out


def _index_items(value: Any, what: str) -> Iterator[Any]:
    """The items of :func:`compact_indices` output, checked: integers, and ranges as ``(first, last)`` holding at
    most :data:`MAX_CHARGES` indices in all; malformed input raises InvalidParameterError."""
    if not isinstance(value, (list, tuple)):
        raise InvalidParameterError(f"{what} must be a list of indices, got {type(value).__name__}.")
    total = 0
    for item in value:
        if type(item) is int:  # the common case first (bool is not of type int)
            total += 1
            yield item
        elif isinstance(item, (list, tuple)):
            if len(item) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in item):
                raise InvalidParameterError(f"{what}: a range must be [first, last] of two integers, got {item!r}.")
            first, last = item
            if not 0 <= first <= last or total + last - first + 1 > MAX_CHARGES:
                raise InvalidParameterError(
                    f"{what}: range {item!r} must satisfy 0 <= first <= last and hold at most {MAX_CHARGES:.0e} "
                    "indices in all."
                )
            total += last - first + 1
            yield (int(first), int(last))
        elif isinstance(item, bool) or not isinstance(item, int):
            raise InvalidParameterError(f"{what} must hold integers or [first, last] ranges, got {item!r}.")
        else:
            total += 1
            yield item


def expand_indices(value: Any, what: str = "indices") -> tuple[int, ...]:
    """Indices from :func:`compact_indices` output or a plain list of integers; ranges may hold at most
    :data:`MAX_CHARGES` indices in all, malformed input raises InvalidParameterError."""
    out: list[int] = []
    for item in _index_items(value, what):
        if type(item) is tuple:
            out.extend(range(item[0], item[1] + 1))
        else:
            out.append(item)
    return tuple(out)


def check_indices(value: Any, what: str = "indices") -> None:
    """Raise InvalidParameterError where :func:`expand_indices` would, without expanding anything."""
    for _ in _index_items(value, what):
        pass


def indices_equal(value: Any, increasing: Sequence[int], what: str = "indices") -> bool:
    """``expand_indices(value) == tuple(increasing)`` for a strictly increasing ``increasing`` (the charge indices
    of every composition group are), without expanding ``value``'s ranges: a slice of a strictly increasing
    sequence of integers that starts at ``first``, ends at ``last`` and holds ``last - first + 1`` of them is
    ``first, ..., last``."""
    position, n = 0, len(increasing)
    for item in _index_items(value, what):
        if type(item) is tuple:
            first, last = item
            end = position + last - first  # where ``last`` must stand
            if end >= n or increasing[position] != first or increasing[end] != last:
                return False
            position = end + 1
        else:
            if position >= n or increasing[position] != item:
                return False
            position += 1
    return position == n


def compress_events(events: Iterable[PrivacyEvent]) -> tuple[PrivacyEvent, ...]:
    """``events`` with every run of equal consecutive events stored once with its count.

    ``e, e, e`` becomes ``RepeatedEvent(e, 3)``; ``RepeatedEvent(e, a)`` followed by ``e`` or
    ``RepeatedEvent(e, b)`` merges into ``RepeatedEvent(e, a + 1)`` / ``RepeatedEvent(e, a + b)``. Adaptive
    composition of n copies of a mechanism is its n-fold self-composition, which every accountant composes
    from the count (dp-accounting's ``SelfComposedDpEvent``), so the epsilon is the same and nothing is
    ever expanded. A run of one event is kept as given.
    """
    runs: list[list[Any]] = []  # [base event, count, the event as given when the run has one element]
    for event in events:
        base, count = (event.event, event.count) if isinstance(event, RepeatedEvent) else (event, 1)
        if runs and runs[-1][0] == base:
            runs[-1][1] += count
            runs[-1][2] = None
        else:
            runs.append([base, count, event])
    return tuple(given if given is not None else RepeatedEvent(base, count) for base, count, given in runs)


def charges_to_list(charges: Sequence["Charge"]) -> list[dict[str, Any]]:
    """JSON form of ``charges``: a run of equal consecutive charges is one entry with ``"repeat": n``."""
    out: list[dict[str, Any]] = []
    previous: Charge | None = None
    for charge in charges:
        if previous is not None and (charge is previous or charge == previous):
            out[-1]["repeat"] = out[-1].get("repeat", 1) + 1
        else:
            out.append(charge.to_dict())
            previous = charge
    return out


class ChargeRuns(tuple):
    """Charges as :func:`charges_from_list` returns them: an immutable sequence (a run of n equal consecutive
    charges is n references to one :class:`Charge`) that also records where each such run starts and stops
    (``runs``), so that composition walks the runs instead of every charge."""

    runs: tuple[tuple[int, int], ...]

    def __new__(cls, charges: Iterable["Charge"], runs: Sequence[tuple[int, int]]) -> "ChargeRuns":
        self = super().__new__(cls, charges)
        self.runs = tuple(runs)
        return self


def charge_runs(charges: Sequence["Charge"]) -> tuple[tuple[int, int], ...]:
    """``(start, stop)`` of every maximal run of one :class:`Charge` object in ``charges`` (``charges[start:stop]``
    are references to one object), found with numpy over the objects' ids, or read from a :class:`ChargeRuns`."""
    if isinstance(charges, ChargeRuns):
        return charges.runs
    n = len(charges)
    if n == 0:
        return ()
    ids = np.fromiter(map(id, charges), dtype=np.uint64, count=n)
    cuts = (np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist()
    return tuple(zip([0, *cuts], [*cuts, n]))


def distinct_charges(charges: Sequence["Charge"]) -> list["Charge"]:
    """The distinct :class:`Charge` objects of ``charges`` (one per run of references to one object)."""
    return list({id(c): c for c in (charges[start] for start, _ in charge_runs(charges))}.values())


def charges_from_list(entries: Any, what: str = "charges") -> ChargeRuns:
    """Charges from :func:`charges_to_list` output (or a version-1 list): an entry with ``"repeat": n`` stands for n
    equal consecutive charges, held as n references to one :class:`Charge`. Malformed input raises
    InvalidParameterError; expanding to more than :data:`MAX_CHARGES` charges is refused.

    Entries whose ``events`` are the same JSON share one parsed tuple of events (the events of 10^4 equal-size
    tasks are parsed and validated once): events are immutable, and equal JSON text gives equal events."""
    if not isinstance(entries, list):
        raise InvalidParameterError(f"{what} must be a list of charges, got {type(entries).__name__}.")
    out: list[Charge] = []
    runs: list[tuple[int, int]] = []
    parsed: dict[str, tuple[PrivacyEvent, ...]] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise InvalidParameterError(f"{what}[{i}] must be a JSON object, got {type(entry).__name__}.")
        repeat = entry.get("repeat", 1)
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            raise InvalidParameterError(f"{what}[{i}] repeat must be an integer >= 1, got {repeat!r}.")
        if len(out) + repeat > MAX_CHARGES:
            raise InvalidParameterError(
                f"{what} expand to more than {MAX_CHARGES:.0e} charges (entry {i} repeats {repeat} times); "
                "dpcl handles at most that many charges per ledger: charge a run's steps as one RepeatedEvent."
            )
        try:
            charge = Charge.from_dict(entry, parsed)  # reads tasks, events and label only
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidParameterError(f"{what}[{i}] is malformed: {exc!r}.") from exc
        runs.append((len(out), len(out) + repeat))
        out.extend([charge] * repeat)
    return ChargeRuns(out, runs)

