"""The task ledger: which release used which task's data, and what each release guarantees.

Task-wise DP (Tobaben et al., Def. 4.1) charges every privacy event to the task
datasets D_t it reads. After each release (the checkpoint after task t) the
ledger reports the cumulative guarantee of everything released so far:

* ``parallel`` (Thm 4.4, proof App. C.2): tasks hold disjoint privacy units. A
  unit lives in one D_k, so only the events that read D_k can depend on it; all
  others are post-processing of earlier releases. The stream is (max_k eps_k,
  delta) where eps_k composes the events charged to D_k. For methods that charge
  one task per release this is exactly "the worst task". The proof in App. C.2
  is written for independent mechanisms; the same argument holds for adaptively
  chosen ones (naive fine-tuning from the previous release) because a mechanism
  that does not read D_k is 0-DP with respect to a unit of D_k.
* ``sequential`` (Thm 4.5, App. C.3): units may be shared between tasks. All
  events charged so far are composed with the tightest sound accountant of
  :func:`dpcl.accounting.accountants.compute_epsilon`.
* a privacy filter (:class:`dpcl.accounting.filter.PrivacyFilter`, fully adaptive
  composition) when ``total_epsilon`` caps an open-ended stream: a charge that
  would overspend is refused with :class:`~dpcl.errors.BudgetExceededError`
  *before* it is recorded, so the task is never trained.

Disjointness is an assumption the user states; when unit ids are given, the
ledger checks it and refuses (:class:`~dpcl.errors.DisjointnessViolationError`)
a task that shares a unit with another, naming one shared unit.

Persistence: the ledger is one JSON file written atomically
(:func:`dpcl._io.atomic_io.write_json_atomic`) and a journal beside it to which every later change
appends one hash-chained line of what changed (:meth:`TaskLedger.save`), folded into the file by
:meth:`TaskLedger.compact` when it grows larger than the file, when a run resumes and when it stops. Repetition is stored once
with its count and never expanded (format version 2, :data:`LEDGER_VERSION`;
version 1 is still read): a run of equal events in one charge is one
:class:`~dpcl.accounting.events.RepeatedEvent` (:func:`compress_events`, applied
by :meth:`TaskLedger.charge`), which the accountants compose as a
self-composition (dp-accounting's ``SelfComposedDpEvent``); a run of equal
consecutive charges is one entry with ``"repeat": n`` (:func:`charges_to_list`);
and a release lists only the composition groups that changed since the
previous release (``groups_kept``: how many leading groups it shares with it),
and ``"notes": "same"`` when its notes are the previous release's; runs of
consecutive task and charge indices in a group are ``[first, last]``. It carries a SHA-256 of
its own content; a truncated, corrupt or edited file raises
:class:`~dpcl.errors.LedgerCorruptError` and is never replaced silently. The hash
is not a signature, so :meth:`TaskLedger.from_dict` also refuses content that is
inconsistent whatever its hash (events under other settings, releases covering
charges that are not recorded, charges that overspend the ledger's filter).
Charges are written *before* training, so a run killed between (or during) tasks
resumes with every unit of budget already spent; charging a task again after a
crash adds a second charge (conservative: the killed attempt may have leaked).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from dpcl.accounting.accountants import compute_epsilon
from dpcl.accounting.events import Adjacency, ComposedEvent, PrivacyEvent, RepeatedEvent, event_from_dict
from dpcl.accounting.filter import PrivacyFilter
from dpcl.accounting.validation import check_delta, check_positive
from dpcl.errors import (
    ConfigError,
    DisjointnessViolationError,
    InvalidParameterError,
    LedgerCorruptError,
    PrivacyViolationError,
)
from dpcl._io.atomic_io import (
    MAX_JSON_BYTES,
    FileTooLargeError,
    append_bytes_durably,
    collector_paused,
    parse_json,
    read_bytes_limited,
    read_json,
    write_json_atomic,
)

__all__ = [
    "ACROSS_TASKS",
    "Charge",
    "GroupGuarantee",
    "StreamGuarantee",
    "ReleaseRecord",
    "TaskLedger",
    "ChargeRuns",
    "charge_runs",
    "charges_from_list",
    "charges_to_list",
    "compact_indices",
    "compose_stream",
    "compress_events",
    "distinct_charges",
    "event_is_gaussian_type",
    "check_indices",
    "expand_indices",
    "indices_equal",
    "journal_path",
]

#: Composition modes across tasks, after ``auto`` has been resolved.
ACROSS_TASKS = ("parallel", "sequential")

LEDGER_FORMAT = "dpcl-task-ledger"
#: Version this dpcl writes: 2 (runs of equal charges stored once with ``repeat``, releases list only the groups
#: that changed: ``groups_kept``). Version 1 (every charge and every release's groups written out) is still read.
LEDGER_VERSION = 2
READABLE_LEDGER_VERSIONS = (1, 2)
#: Ledgers with more charges and releases than this are written without indentation.
COMPACT_LEDGER_ENTRIES = 1000
#: Most charges a ledger or certificate may expand its ``repeat`` counts to (a reference each in memory).
MAX_CHARGES = 10**7
#: A ledger's journal is folded into the ledger (one atomic rewrite, :meth:`TaskLedger.compact`) once appending
#: would make it larger than the ledger and than this many bytes: the bytes written over a stream stay linear in
#: its length.
JOURNAL_MIN_BYTES = 1 << 20


def journal_path(path: "str | os.PathLike[str]", ledger_sha256: str) -> Path:
    """The journal of the ledger file ``path`` whose content hash is ``ledger_sha256``:
    ``NAME.<first 16 hex digits of the hash>.journal`` beside it, so that a journal extends one ledger content
    only (one folded into a rewritten ledger no longer names it)."""
    p = Path(path)
    return p.with_name(f"{p.name}.{str(ledger_sha256)[:16]}.journal")


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


def _segments(charges: Sequence["Charge"], idx: Sequence[int]) -> list[list[Any]]:
    """``[charge, count]`` for every run of one charge object among the charges ``idx``, in order."""
    out: list[list[Any]] = []
    for i in idx:
        charge = charges[i]
        if out and out[-1][0] is charge:
            out[-1][1] += 1
        else:
            out.append([charge, 1])
    return out


def _group_events(
    charges: Sequence["Charge"], idx: Sequence[int], segments: Sequence[Sequence[Any]] | None = None
) -> tuple[PrivacyEvent, ...]:
    """The events of charges ``idx``, a run of one charge object repeated n times as one RepeatedEvent.

    ``segments`` are those runs as ``(charge, count)`` when the caller knows them already (:func:`_groups_with_runs`),
    so that the charges need not be walked one by one."""
    out: list[PrivacyEvent] = []
    for charge, count in _segments(charges, idx) if segments is None else segments:
        if count == 1:
            out.extend(charge.events)
        else:
            inner = charge.events[0] if len(charge.events) == 1 else ComposedEvent(charge.events)
            out.append(RepeatedEvent(inner, count))
    return tuple(out)


@dataclass(frozen=True)
class GroupGuarantee:
    """Guarantee of one composition group: the charges that can depend on one privacy unit."""

    tasks: tuple[int, ...]
    charges: tuple[int, ...]
    epsilon: float
    accountant: str
    #: accountant that was asked for (``auto`` names its winner in ``accountant``); recomputation uses it.
    requested_accountant: str = ""

    def to_dict(self, compact: bool = False) -> dict[str, Any]:
        """JSON form; ``compact`` writes every run of consecutive task and charge indices as ``[first, last]``
        (:func:`compact_indices`; ledger format 2 and certificate version 3)."""
        form = compact_indices if compact else list
        return {
            "tasks": form(self.tasks),
            "charges": form(self.charges),
            "epsilon": self.epsilon,
            "accountant": self.accountant,
            "requested_accountant": self.requested_accountant or self.accountant,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GroupGuarantee":
        return cls(
            tasks=expand_indices(data["tasks"], "group tasks"),
            charges=expand_indices(data["charges"], "group charges"),
            epsilon=float(data["epsilon"]),
            accountant=str(data["accountant"]),
            requested_accountant=str(data.get("requested_accountant", data["accountant"])),
        )


class GroupsPrefix(Sequence):
    """The first ``length`` groups of a list that is only appended to while this view exists: the groups of one
    release of a long parallel stream, shared with every later release instead of copied (10^4 releases of
    up to 10^4 groups would otherwise hold 5 x 10^7 references). Reads like a tuple and compares equal to the
    tuple of the same groups; :meth:`TaskLedger._parallel_guarantee` copies the list before it changes a
    group that a view covers."""

    __slots__ = ("_backing", "_length")

    def __init__(self, backing: list[Any], length: int) -> None:
        self._backing = backing
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self._backing[: self._length][index])
        if not -self._length <= index < self._length:
            raise IndexError("group index out of range")
        return self._backing[index % self._length]

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(self._backing, self._length)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GroupsPrefix) and other._backing is self._backing:
            return other._length == self._length
        if isinstance(other, (tuple, GroupsPrefix)):
            return len(other) == self._length and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Any) -> tuple[Any, ...]:
        return tuple(self) + tuple(other)

    def __repr__(self) -> str:
        return repr(tuple(self))


@dataclass(frozen=True)
class StreamGuarantee:
    """Cumulative (epsilon, delta) of every release so far, with how it was composed."""

    epsilon: float
    delta: float
    across_tasks: str
    accountant: str
    adjacency: str
    unit: str
    groups: tuple[GroupGuarantee, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self, groups_kept: int | None = None) -> dict[str, Any]:
        out = {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "across_tasks": self.across_tasks,
            "accountant": self.accountant,
            "adjacency": self.adjacency,
            "unit": self.unit,
            "groups": [g.to_dict(compact=groups_kept is not None) for g in self.groups[groups_kept or 0:]],
            "notes": list(self.notes),
        }
        if groups_kept is not None:
            out["groups_kept"] = groups_kept
        return out


@dataclass(frozen=True)
class ReleaseRecord:
    """The checkpoint released after task ``task_index`` and its cumulative guarantee."""

    task_index: int
    n_charges: int
    guarantee: StreamGuarantee
    checkpoint_sha256: str | None = None

    def to_dict(self, groups_kept: int | None = None) -> dict[str, Any]:
        """JSON form; with ``groups_kept`` (ledger format 2) only the groups after the first ``groups_kept``
        (those shared with the previous release) are listed."""
        return {
            "task_index": self.task_index,
            "n_charges": self.n_charges,
            "checkpoint_sha256": self.checkpoint_sha256,
            "guarantee": self.guarantee.to_dict(groups_kept),
        }


def event_is_gaussian_type(event: PrivacyEvent) -> bool:
    """True when every elementary event is an unsampled Gaussian mechanism (incl. full-batch DP-SGD, q = 1),
    so Gaussian DP composes it exactly and the GDP filter applies."""
    return all(
        leaf.kind in ("gaussian", "heterogeneous_gaussian")
        or (leaf.kind == "poisson_sampled_gaussian" and leaf.sample_rate == 1.0)
        for leaf, _ in event.leaves()
    )


def _compute(events: Sequence[PrivacyEvent], delta: float, accountant: str):
    return compute_epsilon(list(events), delta, accountant)


def _composition_groups(charges: Sequence[Charge], across_tasks: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(tasks, charge indices) of every group that must be accounted.

    Under ``parallel`` a unit of D_k is touched by the charges that read D_k. A
    group whose charges are a subset of another group's is dropped: its true
    epsilon is at most the larger group's (the smaller composition is a
    post-processing of the larger one), so the larger group's bound covers it.
    """
    return [(tasks, idx) for tasks, idx, _ in _groups_with_runs(charges, across_tasks)]


def _groups_with_runs(
    charges: Sequence[Charge], across_tasks: str
) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[Charge, int], ...] | None]]:
    """:func:`_composition_groups` with each group's runs of one charge object as ``(charge, count)`` (as
    :func:`_segments` finds them; None for a group of charges that read several tasks). The charges are walked
    run by run (:func:`charge_runs`), so 10^6 references to 10^4 charges cost 10^4 steps."""
    if across_tasks == "sequential":
        multi = [c for c in distinct_charges(charges) if len(c.tasks) > 1]
        if multi:
            c = multi[0]
            raise PrivacyViolationError(
                f"{c.label or 'a charge'} reads the data of several tasks {list(c.tasks)} "
                "while tasks may share privacy units (sequential composition): a shared unit can then occur "
                "several times in one training set, which a per-example accountant does not bound (it needs "
                "group privacy). Declare disjoint units (parallel composition) or train on one task at a time."
            )
        runs = charge_runs(charges)
        tasks = tuple(sorted({t for start, _ in runs for t in charges[start].tasks}))
        return [(tasks, tuple(range(len(charges))), tuple((charges[i], j - i) for i, j in runs))]
    by_task: dict[int, list[int]] = {}
    segments: dict[int, list[Any]] = {}
    single_task = True
    for i, j in charge_runs(charges):  # a run of one charge object (equal charges stored once) is handled at once
        c = charges[i]
        for t in c.tasks:
            by_task.setdefault(t, []).extend(range(i, j))
            own = segments.setdefault(t, [])
            if own and own[-1][0] is c:
                own[-1] = (c, own[-1][1] + j - i)
            else:
                own.append((c, j - i))
        single_task = single_task and len(c.tasks) == 1
    if single_task:  # every charge reads one task: the groups are the tasks, whose charges are disjoint
        return [((t,), tuple(idx), tuple(segments[t])) for t, idx in sorted(by_task.items())]
    groups: dict[frozenset[int], list[int]] = {}
    for t, idx in by_task.items():
        groups.setdefault(frozenset(idx), []).append(t)
    # a set strictly contains k only if it contains k's smallest charge: compare k with those sets alone
    # (one set each when every charge reads one task, so this is linear in the number of groups)
    keys_with: dict[int, list[frozenset[int]]] = {}
    for k in groups:
        for i in k:
            keys_with.setdefault(i, []).append(k)
    out: list[tuple[tuple[int, ...], tuple[int, ...], None]] = []
    for k in groups:
        containing = [other for other in keys_with[min(k)] if k < other]
        if containing:
            continue
        subsets = {other for i in k for other in keys_with[i] if other <= k}
        covered = [t for other in subsets for t in groups[other]]
        out.append((tuple(sorted(covered)), tuple(sorted(k)), None))
    out.sort(key=lambda g: g[0][0])
    return out


def compose_stream(
    charges: Sequence[Charge],
    across_tasks: str,
    delta: float,
    accountant: str = "auto",
    group_accountants: Sequence[str] | None = None,
    cache: dict[Any, Any] | None = None,
) -> StreamGuarantee:
    """Cumulative guarantee of ``charges`` (Tobaben et al., Thm 4.4 / 4.5).

    ``group_accountants`` fixes the accountant of each group (used by
    certificate verification to recompute exactly what was stated); otherwise
    ``accountant`` is used for every group (``auto`` picks the tightest sound one).
    ``cache`` (a dict owned by the caller) memoises group results by charge
    indices: charges are immutable and only appended, so a group seen before
    has the same epsilon.
    """
    if across_tasks not in ACROSS_TASKS:
        raise InvalidParameterError(f"across_tasks must be one of {', '.join(ACROSS_TASKS)}, got {across_tasks!r}.")
    delta = float(check_delta("delta", delta))
    if not charges:
        raise InvalidParameterError("no charge recorded yet: nothing to compose.")
    distinct = distinct_charges(charges)  # a run of equal charges is one object
    adjacencies = {e.adjacency for c in distinct for e in c.events}
    units = {e.unit for c in distinct for e in c.events}
    if len(adjacencies) > 1 or len(units) > 1:
        raise InvalidParameterError(
            f"all charges must share one adjacency and privacy unit; got {sorted(a.value for a in adjacencies)} "
            f"and {sorted(units)}."
        )
    groups = _groups_with_runs(charges, across_tasks)
    if group_accountants is not None and len(group_accountants) != len(groups):
        raise InvalidParameterError(
            f"group_accountants gives {len(group_accountants)} accountants for {len(groups)} composition groups."
        )
    results: list[GroupGuarantee] = []
    notes: dict[str, None] = {}
    cache = {} if cache is None else cache
    # groups whose runs hold the same events objects with the same counts (the equal-size tasks of a certificate,
    # whose charges share one parsed tuple of events) are one composition: accounted once in this call. The ids
    # are those of events held by ``charges`` for the whole call, so no id is reused while this dict lives.
    same_runs: dict[tuple[Any, ...], tuple[float, str, tuple[str, ...]]] = {}
    for g, (tasks, idx, segments) in enumerate(groups):
        acct = accountant if group_accountants is None else group_accountants[g]
        shape = None if segments is None else (acct, *((id(c.events), n) for c, n in segments))
        if shape is not None and shape in same_runs:
            eps, used, res_notes = same_runs[shape]
        else:
            eps, used, res_notes = _group_epsilon(charges, idx, delta, acct, cache, segments)
            if shape is not None:
                same_runs[shape] = (eps, used, res_notes)
        results.append(
            GroupGuarantee(tasks=tasks, charges=idx, epsilon=eps, accountant=used, requested_accountant=acct)
        )
        notes.update(dict.fromkeys(res_notes))
    worst = max(results, key=lambda r: r.epsilon)
    names = sorted({r.accountant for r in results})
    return StreamGuarantee(
        epsilon=worst.epsilon,
        delta=delta,
        across_tasks=across_tasks,
        accountant=names[0] if len(names) == 1 else "+".join(names),
        adjacency=next(iter(adjacencies)).value,
        unit=next(iter(units)),
        groups=tuple(results),
        notes=tuple(notes),
    )


def _group_epsilon(
    charges: Sequence[Charge],
    idx: tuple[int, ...],
    delta: float,
    accountant: str,
    cache: dict[Any, Any],
    segments: Sequence[Sequence[Any]] | None = None,
) -> tuple[float, str, tuple[str, ...]]:
    """(epsilon, accountant used, notes) of the composition of charges ``idx``, memoised in ``cache``.

    Keyed by charge indices (charges are immutable and only appended) and by the events themselves: groups
    that hold equal events (equal-size tasks under parallel composition) have the same epsilon, so a stream
    of 10^4 such tasks runs the accountant once.
    """
    key = (idx, accountant, delta)
    if key not in cache:
        events = _group_events(charges, idx, segments)
        content = ("events", events, accountant, delta)
        if content not in cache:
            res = _compute(events, delta, accountant)
            cache[content] = (float(res.epsilon), res.accountant, tuple(res.notes))
        cache[key] = cache[content]
    return cache[key]


def _extended(previous: Sequence[Any], kept: int, new: list[Any]) -> Sequence[Any]:
    """``previous[:kept] + new`` for a loaded release: when it keeps all of ``previous`` it shares its list (a
    :class:`GroupsPrefix`), so loading 10^4 releases does not copy 10^4 groups each."""
    if kept == len(previous):
        if isinstance(previous, GroupsPrefix) and len(previous._backing) == len(previous):
            backing = previous._backing
        else:
            backing = list(previous)
        backing.extend(new)
        return GroupsPrefix(backing, len(backing))
    return tuple(previous[:kept]) + tuple(new)


def _shared_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (compared in C first: usually all of ``a``)."""
    n = min(len(a), len(b))
    if isinstance(a, GroupsPrefix) and isinstance(b, GroupsPrefix) and a._backing is b._backing:
        return n
    if tuple(a[:n]) == tuple(b[:n]):
        return n
    return next(i for i in range(n) if a[i] != b[i])


def _same_json(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same JSON value (``1``, ``1.0`` and ``true`` differ, unlike in Python)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b))
    return a == b


def _json_patch(old: Any, new: Any, path: tuple[str, ...] = ()) -> list[list[Any]]:
    """Operations turning JSON object ``old`` into ``new``: ``["set", path, value]``, ``["del", path]`` and
    ``["extend", path, items]`` (a list that only grew), ``path`` the keys from the root (metadata grows by a
    release's certificate and label counts, so a journal line holds those, not the whole metadata)."""
    if type(old) is dict and type(new) is dict:
        ops: list[list[Any]] = [["del", [*path, k]] for k in old if k not in new]
        for k, v in new.items():
            if k not in old:
                ops.append(["set", [*path, k], v])
            elif not _same_json(old[k], v):
                ops.extend(_json_patch(old[k], v, (*path, k)))
        return ops
    if type(old) is list and type(new) is list and len(new) > len(old) and _same_json(new[: len(old)], old):
        return [["extend", list(path), new[len(old):]]]
    return [["set", list(path), new]]


def _apply_json_patch(target: dict[str, Any], ops: Any, where: str) -> None:
    """Apply :func:`_json_patch` operations to ``target`` in place; malformed ones raise LedgerCorruptError."""
    if not isinstance(ops, list):
        raise LedgerCorruptError(f"{where}: metadata changes must be a list.")
    for op in ops:
        if not (isinstance(op, list) and len(op) in (2, 3) and op[0] in ("set", "del", "extend")
                and isinstance(op[1], list) and op[1] and all(isinstance(k, str) for k in op[1])
                and (len(op) == 3) == (op[0] != "del")):
            raise LedgerCorruptError(f"{where}: malformed metadata change {op!r:.100}.")
        *parents, key = op[1]
        node: Any = target
        for k in parents:
            node = node.get(k) if isinstance(node, dict) else None
        if not isinstance(node, dict) or (op[0] != "set" and key not in node):
            raise LedgerCorruptError(f"{where}: metadata change {op[0]} {op[1]!r} names no such entry.")
        if op[0] == "set":
            node[key] = op[2]
        elif op[0] == "del":
            del node[key]
        elif isinstance(node[key], list) and isinstance(op[2], list):
            node[key].extend(op[2])
        else:
            raise LedgerCorruptError(f"{where}: metadata change extend {op[1]!r} does not extend a list.")


def _canonical(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _unit_keys(unit_ids: Any) -> np.ndarray:
    array = np.asarray(unit_ids)
    if array.ndim != 1:
        raise InvalidParameterError(f"unit_ids must be a 1-D sequence of unit ids, got shape {array.shape}.")
    return array.astype(str)


class TaskLedger:
    """Records charges and releases of a continual-learning run; persists itself atomically.

    Parameters
    ----------
    delta:
        Target delta of every reported guarantee.
    across_tasks:
        ``"parallel"`` (disjoint units, Thm 4.4) or ``"sequential"`` (Thm 4.5).
    accountant:
        Accountant name passed to :func:`compute_epsilon` (``"auto"`` = tightest sound).
    total_epsilon, total_delta:
        Optional budget of a privacy filter over the stream (fully adaptive
        composition). Under ``sequential`` one filter guards the whole stream;
        under ``parallel`` one filter guards each task's data.
    path:
        JSON file the ledger is saved to after every change (optional).
    metadata:
        Free JSON-able information (config, label-space policy...) kept with the ledger.
    """

    def __init__(
        self,
        *,
        delta: float,
        across_tasks: str,
        accountant: str = "auto",
        adjacency: "Adjacency | str" = Adjacency.ADD_REMOVE,
        unit: str = "example",
        total_epsilon: float | None = None,
        total_delta: float | None = None,
        path: "str | os.PathLike[str] | None" = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        if across_tasks not in ACROSS_TASKS:
            raise InvalidParameterError(
                f"across_tasks must be one of {', '.join(ACROSS_TASKS)} (resolve 'auto' first), got {across_tasks!r}."
            )
        self.delta = float(check_delta("delta", delta))
        self.across_tasks = across_tasks
        self.accountant = str(accountant)
        self.adjacency = Adjacency.parse(adjacency)
        self.unit = str(unit)
        if total_epsilon is None and total_delta is not None:
            raise InvalidParameterError("total_delta is only meaningful together with total_epsilon.")
        self.total_epsilon = None if total_epsilon is None else float(check_positive("total_epsilon", total_epsilon))
        self.total_delta = (
            None
            if total_epsilon is None
            else float(check_delta("total_delta", self.delta if total_delta is None else total_delta))
        )
        self.path = None if path is None else Path(path)
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.charges: list[Charge] = []
        self.releases: list[ReleaseRecord] = []
        self._units: dict[int, list[Any]] = {}
        self._filters: dict[str, Any] = {}
        self._cache: dict[int, StreamGuarantee] = {}
        self._group_cache: dict[Any, tuple[float, str, tuple[str, ...]]] = {}
        # charge indices reading each task, and the incremental parallel composition (see _parallel_guarantee)
        self._task_charges: dict[int, list[int]] = {}
        self._single_task_charges = True
        self._parallel: dict[str, Any] = {"tasks": [], "groups": [], "dirty": set(), "worst": -1,
                                          "notes": {}, "group_notes": {}, "accountants": {}, "shared": 0}
        # what is on disk at ``path`` (see save): None until the first save or load
        self._persisted: dict[str, Any] | None = None
        self._units_dirty: set[int] = set()
        #: bytes of a torn last journal line that :meth:`load` dropped (0: none)
        self.torn_journal_bytes = 0

    # -- settings ----------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        return {
            "delta": self.delta,
            "across_tasks": self.across_tasks,
            "accountant": self.accountant,
            "adjacency": self.adjacency.value,
            "unit": self.unit,
            "total_epsilon": self.total_epsilon,
            "total_delta": self.total_delta,
        }

    @property
    def uses_filter(self) -> bool:
        return self.total_epsilon is not None

    # -- privacy filter ------------------------------------------------------
    def _filter_keys(self, tasks: Iterable[int]) -> list[str]:
        return ["stream"] if self.across_tasks == "sequential" else [f"task{t}" for t in tasks]

    def _filter_for(self, key: str, events: Sequence[PrivacyEvent]):
        """A copy of the filter guarding ``key`` (a new one, its rule set by ``events``, if none exists yet)."""
        import copy

        if key in self._filters:
            return copy.deepcopy(self._filters[key])
        rule = "gdp" if all(event_is_gaussian_type(e) for e in events) else "basic"
        return PrivacyFilter(self.total_epsilon, self.total_delta, rule=rule)

    def _admit(self, charge: Charge) -> None:
        """Admit ``charge`` to every filter guarding its tasks, all or none.

        ``gdp`` rule (Gaussian events only): the charge costs its mu. ``basic``
        rule: the k-th admission (k = 0, 1, ...) to a filter gets the delta share
        total_delta / 2^(k+1), so the shares sum to less than total_delta however
        long the stream is, and costs its epsilon at that share. Admission is
        tried on copies first so that a refusal by any filter changes none (and creates none).
        """
        event = charge.events[0] if len(charge.events) == 1 else ComposedEvent(list(charge.events))
        keys = self._filter_keys(charge.tasks)
        trial = {}
        for key in keys:
            flt = self._filter_for(key, charge.events)
            if flt.rule == "gdp":
                flt.admit(event)
            else:
                share = self.total_delta / 2.0 ** (len(flt.charges) + 1)
                if not share > 0:
                    raise InvalidParameterError(
                        f"the privacy filter's delta (total_delta, by default the [privacy] delta) = "
                        f"{self.total_delta!r} is too small: admission {len(flt.charges) + 1} gets total_delta / "
                        f"2^{len(flt.charges) + 1}, which underflows to 0 in float64; use a larger delta."
                    )
                flt.admit(event, delta=share)
            trial[key] = flt
        self._filters.update(trial)

    def filter_state(self) -> dict[str, dict[str, Any]]:
        """Rule, budget, spent and remaining budget of each filter (empty without ``total_epsilon``)."""
        return {key: flt.to_dict() for key, flt in self._filters.items()}

    # -- units -------------------------------------------------------------
    def _check_units(self, tasks: Sequence[int], unit_ids: Any) -> np.ndarray | None:
        if unit_ids is None:
            return None
        keys = _unit_keys(unit_ids)
        if self.across_tasks != "parallel":
            return keys
        for other, ids in self._units.items():
            if other in tasks:
                continue
            shared = np.intersect1d(keys, _unit_keys(ids), assume_unique=False)
            if shared.size:
                reading = f"task {tasks[0]}" if len(tasks) == 1 else "tasks " + ", ".join(str(t) for t in tasks)
                raise DisjointnessViolationError(
                    f"{reading} and task {other} are declared to hold disjoint privacy units but share "
                    f"unit {str(shared[0])!r} ({shared.size} shared in all); parallel composition (Thm 4.4) does not "
                    "apply. Remove the shared units or use across_tasks = 'sequential'."
                )
        return keys

    def register_units(self, task_index: int, unit_ids: Any) -> None:
        """Record the privacy-unit ids of one task's data; under parallel composition a unit already held
        by another task raises :class:`DisjointnessViolationError` naming it (nothing is recorded then)."""
        t = int(task_index)
        keys = self._check_units((t,), unit_ids)
        previous = self._units.get(t, [])
        merged = np.union1d(_unit_keys(previous), keys) if previous else np.unique(keys)
        self._units[t] = merged.tolist()
        self._units_dirty.add(t)
        self.save()

    # -- charging and releasing -----------------------------------------------
    def charge(
        self,
        tasks: "int | Sequence[int]",
        events: "PrivacyEvent | Sequence[PrivacyEvent]",
        *,
        unit_ids: Any = None,
        label: str = "",
    ) -> Charge:
        """Charge ``events`` to the data of ``tasks`` *before* training on it; saves the ledger.

        Raises :class:`DisjointnessViolationError` when unit ids show a shared unit
        under parallel composition and :class:`BudgetExceededError` when a filter
        refuses; in both cases nothing is recorded.
        """
        task_tuple = (int(tasks),) if isinstance(tasks, (int, np.integer)) else tuple(int(t) for t in tasks)
        if not task_tuple or any(t < 0 for t in task_tuple):
            raise InvalidParameterError(f"tasks must be non-negative task indices, got {tasks!r}.")
        event_tuple = (events,) if isinstance(events, PrivacyEvent) else tuple(events)
        if not event_tuple or not all(isinstance(e, PrivacyEvent) for e in event_tuple):
            raise InvalidParameterError("events must be one or more PrivacyEvent objects.")
        for e in event_tuple:
            if e.adjacency is not self.adjacency or e.unit != self.unit:
                raise InvalidParameterError(
                    f"event states adjacency {e.adjacency.value!r} and unit {e.unit!r} but the ledger accounts "
                    f"{self.adjacency.value!r} / {self.unit!r}."
                )
        if self.across_tasks == "sequential" and len(task_tuple) > 1:
            _composition_groups([Charge(task_tuple, event_tuple, label)], "sequential")
        keys = self._check_units(task_tuple, unit_ids)
        charge = Charge(task_tuple, compress_events(event_tuple), label)
        if self.charges and self.charges[-1] == charge:
            charge = self.charges[-1]  # one object for a run of equal charges: stored and composed once with its count
        if self.uses_filter:
            self._admit(charge)
        self._append(charge)
        if keys is not None:
            for t in task_tuple:
                previous = self._units.get(t, [])
                merged = np.union1d(_unit_keys(previous), keys) if previous else np.unique(keys)
                self._units[t] = merged.tolist()
                self._units_dirty.add(t)
        self.save()
        return charge

    def _append(self, charge: Charge) -> None:
        index = len(self.charges)
        self.charges.append(charge)
        for t in charge.tasks:
            self._task_charges.setdefault(t, []).append(index)
            self._parallel["dirty"].add(t)
        if len(charge.tasks) > 1:
            self._single_task_charges = False

    def guarantee(self) -> StreamGuarantee:
        """Cumulative guarantee of everything charged so far."""
        n = len(self.charges)
        if n not in self._cache:
            if self.across_tasks == "parallel" and self._single_task_charges and n:
                self._cache[n] = self._parallel_guarantee()
            else:
                self._cache[n] = compose_stream(
                    self.charges, self.across_tasks, self.delta, self.accountant, cache=self._group_cache
                )
        return self._cache[n]

    def _parallel_guarantee(self) -> StreamGuarantee:
        """:func:`compose_stream` under parallel composition when every charge reads one task, updated in place.

        Each task is then its own group (its charges are read by no other task), so a new charge changes one
        group: only the groups of tasks charged since the last call are recomputed, and the worst group is
        tracked instead of searched, which keeps a stream of 10^4 releases linear instead of quadratic. The
        result equals :func:`compose_stream`'s (a test compares them).
        """
        import bisect

        state = self._parallel
        tasks: list[int] = state["tasks"]
        groups: list[GroupGuarantee] = state["groups"]
        rescan = False
        for t in sorted(state["dirty"]):
            idx = tuple(self._task_charges[t])
            eps, used, res_notes = _group_epsilon(self.charges, idx, self.delta, self.accountant, self._group_cache)
            group = GroupGuarantee(tasks=(t,), charges=idx, epsilon=eps, accountant=used,
                                   requested_accountant=self.accountant)
            pos = bisect.bisect_left(tasks, t)
            if pos < state["shared"]:  # a released guarantee's view covers this position: copy before changing it
                state["groups"] = groups = list(groups)
                state["shared"] = 0
            if pos < len(tasks) and tasks[pos] == t:
                old = groups[pos]
                state["accountants"][old.accountant] -= 1
                for note in state["group_notes"][t]:
                    state["notes"][note] -= 1
                groups[pos] = group
                if pos == state["worst"] and eps < old.epsilon:
                    rescan = True
            else:
                tasks.insert(pos, t)
                groups.insert(pos, group)
                if state["worst"] >= pos:
                    state["worst"] += 1
            state["accountants"][used] = state["accountants"].get(used, 0) + 1
            state["group_notes"][t] = res_notes
            for note in res_notes:
                state["notes"][note] = state["notes"].get(note, 0) + 1
            if not rescan and (state["worst"] < 0 or eps > groups[state["worst"]].epsilon):
                state["worst"] = pos
        state["dirty"] = set()
        if rescan:
            state["worst"] = max(range(len(groups)), key=lambda i: groups[i].epsilon)
        names = sorted(name for name, count in state["accountants"].items() if count > 0)
        state["shared"] = len(groups)
        return StreamGuarantee(
            epsilon=groups[state["worst"]].epsilon,
            delta=self.delta,
            across_tasks="parallel",
            accountant=names[0] if len(names) == 1 else "+".join(names),
            adjacency=self.adjacency.value,
            unit=self.unit,
            groups=GroupsPrefix(groups, len(groups)),
            notes=tuple(note for note, count in state["notes"].items() if count > 0),
        )

    def task_guarantee(self, task_index: int) -> float:
        """Epsilon (at the ledger's delta) of the events charged to one task's data alone."""
        idx = tuple(self._task_charges.get(int(task_index), ()))
        if not idx:
            raise InvalidParameterError(f"no charge recorded for task {task_index}.")
        return _group_epsilon(self.charges, idx, self.delta, self.accountant, self._group_cache)[0]

    def events_epsilon(self, events: Sequence[PrivacyEvent]) -> float:
        """Epsilon (at the ledger's delta and accountant) of ``events`` alone."""
        return float(_compute(list(events), self.delta, self.accountant).epsilon)

    def release(self, task_index: int, *, checkpoint_sha256: str | None = None) -> ReleaseRecord:
        """Record the checkpoint released after ``task_index`` with its cumulative guarantee; saves."""
        if not self.charges:
            raise InvalidParameterError("cannot release before any task has been charged.")
        record = ReleaseRecord(
            task_index=int(task_index),
            n_charges=len(self.charges),
            guarantee=self.guarantee(),
            checkpoint_sha256=checkpoint_sha256,
        )
        self.releases.append(record)
        self.save()
        return record

    def charged_tasks(self) -> list[int]:
        return sorted({t for c in self.charges for t in c.tasks})

    def released_tasks(self) -> list[int]:
        return [r.task_index for r in self.releases]

    def unit_ids(self, task_index: int) -> list[Any]:
        return list(self._units.get(task_index, []))

    # -- persistence ------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        body = {
            "format": LEDGER_FORMAT,
            "version": LEDGER_VERSION,
            "settings": self.settings(),
            "metadata": self.metadata,
            "charges": charges_to_list(self.charges),
            "releases": self._releases_to_list(),
            "units": {str(k): v for k, v in sorted(self._units.items())},
        }
        body["sha256"] = hashlib.sha256(_canonical(body).encode()).hexdigest()
        return body

    def _releases_to_list(self, start: int = 0) -> list[dict[str, Any]]:
        """Release records from ``start`` on, each listing only the groups after those it shares with the previous
        release."""
        out: list[dict[str, Any]] = []
        before = self.releases[start - 1].guarantee if start else None
        previous: Sequence[GroupGuarantee] = before.groups if before else ()
        previous_notes: tuple[str, ...] | None = before.notes if before else None
        for record in self.releases[start:]:
            groups = record.guarantee.groups
            kept = _shared_prefix(previous, groups)
            entry = record.to_dict(groups_kept=kept)
            if record.guarantee.notes == previous_notes:
                entry["guarantee"]["notes"] = "same"  # the previous release's notes
            out.append(entry)
            previous, previous_notes = groups, record.guarantee.notes
        return out

    def save(self) -> None:
        """Make every change since the last save durable at ``path`` (nothing without a path).

        The first save (or one to another path) writes the whole ledger atomically (:meth:`compact`). A later
        save appends one line to the ledger's journal (:func:`journal_path`) holding only what changed: the new
        charges, the new releases, the unit ids of the tasks that got new ones and the changes of ``metadata``,
        so a stream of n releases writes O(n) bytes, not O(n^2). The line is the unit of a save: it is written
        with one ``write`` and ``fsync``-ed before this returns; a crash leaves at most a torn last line, without
        its final newline, which :meth:`load` drops (the save did not happen, as with an interrupted atomic
        rewrite). A journal that would grow larger than the ledger and :data:`JOURNAL_MIN_BYTES` is folded in.
        """
        if self.path is None:
            return
        state = self._persisted
        if state is None or state["path"] != self.path:
            self.compact()
            return
        line, last = self._journal_line(state)
        if line is None:
            return
        if state["journal_bytes"] + len(line) > max(state["ledger_bytes"], JOURNAL_MIN_BYTES):
            self.compact()
            return
        # cut the journal to what is known complete first: a torn line that load dropped, or the part of a line
        # that a failed write (a full disk) left, never prefixes this one
        size = append_bytes_durably(journal_path(self.path, state["sha256"]), line, keep=state["journal_bytes"])
        self._mark_persisted(state, last=last, journal_bytes=size)

    def compact(self) -> None:
        """Write the whole ledger atomically to ``path`` and remove the journal it folds in (nothing without a
        path). A crash in between leaves the new ledger and a journal that names the old one, which no load reads.
        """
        if self.path is None:
            return
        body = self.to_dict()
        state = self._persisted
        # a journal naming the new content cannot be this ledger's (it would be replayed onto it): removed first
        journal_path(self.path, body["sha256"]).unlink(missing_ok=True)
        # indented for reading while small; compact for long streams (a third of the size, far from the
        # 16 MiB that dpcl reads at most)
        long_stream = len(self.charges) + len(self.releases) > COMPACT_LEDGER_ENTRIES
        write_json_atomic(self.path, body, indent=None if long_stream else 2)
        if state is not None and state["path"] == self.path:
            journal_path(self.path, state["sha256"]).unlink(missing_ok=True)
        self._persisted = {"path": self.path, "sha256": body["sha256"], "ledger_bytes": self.path.stat().st_size}
        self._mark_persisted(self._persisted, last=body["sha256"], journal_bytes=0)

    def _mark_persisted(self, state: dict[str, Any], *, last: str, journal_bytes: int) -> None:
        """Record that everything in memory is on disk: ``last`` is the hash the next journal line chains to,
        ``journal_bytes`` the length of the journal's complete lines."""
        state.update(charges=len(self.charges), releases=len(self.releases), metadata=_canonical(self.metadata),
                     last=last, journal_bytes=journal_bytes)
        self._units_dirty = set()

    def _journal_line(self, state: Mapping[str, Any]) -> tuple[bytes | None, str]:
        """The journal line of the changes since ``state`` (None when nothing changed) and its hash."""
        body: dict[str, Any] = {"ledger": state["sha256"], "prev": state["last"]}
        n = state["charges"]
        if len(self.charges) > n:
            entries = charges_to_list(self.charges[n:])
            if n and self.charges[n] == self.charges[n - 1]:  # the run of the last saved charge goes on
                entries[0] = {"repeat_previous": entries[0].get("repeat", 1)}
            body["charges"] = entries
        if len(self.releases) > state["releases"]:
            body["releases"] = self._releases_to_list(state["releases"])
        if self._units_dirty:
            body["units"] = {str(t): self._units[t] for t in sorted(self._units_dirty) if t in self._units}
        metadata = _canonical(self.metadata)
        if metadata != state["metadata"]:
            body["metadata"] = _json_patch(json.loads(state["metadata"]), json.loads(metadata))
        if len(body) == 2:
            return None, state["last"]
        body["sha256"] = hashlib.sha256(_canonical(body).encode()).hexdigest()
        return (json.dumps(body, separators=(",", ":"), allow_nan=False) + "\n").encode(), body["sha256"]

    def _replay_journal(self, ledger_sha256: str, ledger_bytes: int) -> None:
        """Apply the lines of this ledger's journal (if any) in order, each checked against its hash and chained
        to the previous one (the first to the ledger's hash); a damaged or foreign line raises
        :class:`LedgerCorruptError`. A last line without its final newline is a torn write: dropped (the save
        that wrote it never returned), and cut off before the next line is appended."""
        assert self.path is not None
        jpath = journal_path(self.path, ledger_sha256)
        state: dict[str, Any] = {"path": self.path, "sha256": ledger_sha256, "ledger_bytes": ledger_bytes}
        try:
            raw = read_bytes_limited(jpath, MAX_JSON_BYTES, "ledger journal")
        except FileNotFoundError:
            raw = b""
        except FileTooLargeError as exc:
            raise LedgerCorruptError(f"{exc}; restore the ledger and its journal from a backup.") from exc
        complete, newline, torn = raw.rpartition(b"\n")
        last = ledger_sha256
        lines = complete.split(b"\n") if newline else []
        for k, line in enumerate(lines):
            where = f"ledger journal {str(jpath)!r} line {k + 1}"
            try:
                entry = parse_json(line.decode("utf-8"))
                stated = entry.pop("sha256") if isinstance(entry, dict) else None
                actual = hashlib.sha256(_canonical(entry).encode()).hexdigest()
            except (ValueError, UnicodeDecodeError, TypeError) as exc:
                raise LedgerCorruptError(
                    f"{where} is not valid JSON ({exc}): the journal was damaged. Restore the ledger and its journal "
                    "from a backup; they are never repaired automatically."
                ) from exc
            if stated != actual or entry.get("ledger") != ledger_sha256 or entry.get("prev") != last:
                raise LedgerCorruptError(
                    f"{where} failed its integrity check (its hash, or its chain to the ledger and the line before "
                    "it): it was edited, damaged or belongs to another ledger. Restore the ledger and its journal "
                    "from a backup; they are never repaired automatically."
                )
            try:
                self._apply_journal_entry(entry, where)
            except LedgerCorruptError:
                raise
            except (KeyError, TypeError, ValueError, IndexError, InvalidParameterError, PrivacyViolationError) as exc:
                raise LedgerCorruptError(f"{where} is inconsistent: {exc}") from exc
            last = stated
        self.torn_journal_bytes = len(torn)
        self._persisted = state
        self._mark_persisted(state, last=last, journal_bytes=len(raw) - len(torn))
        state["lines"] = len(lines)

    def _apply_journal_entry(self, entry: Mapping[str, Any], where: str) -> None:
        """Add one journal line's charges, releases, unit ids and metadata changes to the ledger."""
        entries = entry.get("charges", [])
        if not isinstance(entries, list):
            raise LedgerCorruptError(f"{where}: charges must be a list.")
        previous = None
        repeated: list[Charge] = []
        if entries and isinstance(entries[0], dict) and "repeat_previous" in entries[0]:
            count = entries[0]["repeat_previous"]
            if set(entries[0]) != {"repeat_previous"} or isinstance(count, bool) or not isinstance(count, int) \
                    or count < 1 or not self.charges:
                raise LedgerCorruptError(f"{where}: repeat_previous must be a count >= 1 of a charge already recorded.")
            previous = self.charges[-1]
            entries = entries[1:]
            repeated = [previous] * min(count, MAX_CHARGES + 1)
        charges = charges_from_list(entries, f"{where} charges")
        if len(self.charges) + len(repeated) + len(charges) > MAX_CHARGES:
            raise LedgerCorruptError(f"{where}: the ledger would hold more than {MAX_CHARGES:.0e} charges.")
        self._load_charges([*repeated, *charges], where, previous=previous)
        self._load_releases(entry.get("releases", []), where, LEDGER_VERSION)
        units = entry.get("units", {})
        if not isinstance(units, dict) or not all(isinstance(v, list) for v in units.values()):
            raise LedgerCorruptError(f"{where}: units must map task indices to lists of unit ids.")
        for t, ids in units.items():
            self._units[int(t)] = list(ids)
        _apply_json_patch(self.metadata, entry.get("metadata", []), where)

    @classmethod
    def from_dict(cls, data: Any, *, path: "str | os.PathLike[str] | None" = None) -> "TaskLedger":
        where = f"ledger {str(path)!r}" if path is not None else "ledger"
        if not isinstance(data, dict) or data.get("format") != LEDGER_FORMAT:
            raise LedgerCorruptError(f"{where} is not a dpcl task ledger (missing format {LEDGER_FORMAT!r}).")
        stated = data.get("sha256")
        body = {k: v for k, v in data.items() if k != "sha256"}
        try:
            actual = hashlib.sha256(_canonical(body).encode()).hexdigest()
        except (TypeError, ValueError) as exc:
            raise LedgerCorruptError(f"{where} holds values that are not plain JSON: {exc}.") from exc
        if stated != actual:
            raise LedgerCorruptError(
                f"{where} failed its integrity check (stored sha256 {str(stated)[:12]}..., content {actual[:12]}...): "
                "it was edited or damaged. Restore it from a backup; it is never replaced automatically."
            )
        version = data.get("version")
        if isinstance(version, bool) or version not in READABLE_LEDGER_VERSIONS:
            raise LedgerCorruptError(
                f"{where} has version {version!r}; this dpcl reads {', '.join(map(str, READABLE_LEDGER_VERSIONS))}."
            )
        try:
            s = data["settings"]
            ledger = cls(
                delta=s["delta"],
                across_tasks=s["across_tasks"],
                accountant=s["accountant"],
                adjacency=s["adjacency"],
                unit=s["unit"],
                total_epsilon=s["total_epsilon"],
                total_delta=s["total_delta"],
                path=None,
                metadata=data.get("metadata", {}),
            )
            charges = (
                [Charge.from_dict(c) for c in data["charges"]] if version == 1 else charges_from_list(data["charges"])
            )
            ledger._units = {int(k): list(v) for k, v in data.get("units", {}).items()}
            ledger._load_charges(charges, where)
            ledger._load_releases(data["releases"], where, version)
        except LedgerCorruptError:
            raise
        except (KeyError, TypeError, ValueError, InvalidParameterError, PrivacyViolationError) as exc:
            raise LedgerCorruptError(f"{where} is inconsistent: {exc}") from exc
        ledger.path = None if path is None else Path(path)
        return ledger

    def _load_charges(self, charges: Sequence[Charge], where: str, previous: Charge | None = None) -> None:
        """Check and append charges read from a file (the ledger or its journal): each distinct charge reads a task
        and holds events under the ledger's settings; every one is admitted to the filter. ``previous`` is a charge
        already appended whose repetitions ``charges`` may continue (checked already)."""
        checked = previous
        offset = len(self.charges)
        for i, c in enumerate(charges):
            if c is checked:  # a repeated charge: checked already (admitted to the filter below every time)
                if self.uses_filter:
                    self._admit(c)
                self._append(c)
                continue
            checked = c
            if not c.tasks or any(t < 0 for t in c.tasks) or not c.events:
                raise LedgerCorruptError(
                    f"{where}: charge {offset + i} must read at least one task index >= 0 and hold at least one event."
                )
            for e in c.events:
                if e.adjacency is not self.adjacency or e.unit != self.unit:
                    raise LedgerCorruptError(
                        f"{where}: charge {offset + i} holds an event under {e.adjacency.value!r} / {e.unit!r} but the "
                        f"ledger accounts {self.adjacency.value!r} / {self.unit!r}."
                    )
            if self.across_tasks == "sequential" and len(c.tasks) > 1:
                _composition_groups([c], "sequential")
            if self.uses_filter:
                self._admit(c)
            self._append(c)

    def _load_releases(self, entries: Any, where: str, version: int) -> None:
        """Check and append release records read from a file (the ledger or its journal)."""
        for r in entries:
            g = r["guarantee"]
            kept = g.get("groups_kept", 0) if version >= 2 else 0
            if g.get("notes") == "same" and not (version >= 2 and self.releases):
                raise LedgerCorruptError(f"{where}: release {len(self.releases)} refers to a previous release's notes.")
            previous_groups = self.releases[-1].guarantee.groups if self.releases else ()
            if isinstance(kept, bool) or not isinstance(kept, int) or not 0 <= kept <= len(previous_groups):
                raise LedgerCorruptError(
                    f"{where}: release {len(self.releases)} keeps {kept!r} groups of the previous release, "
                    f"which has {len(previous_groups)}."
                )
            guarantee = StreamGuarantee(
                epsilon=float(g["epsilon"]),
                delta=float(g["delta"]),
                across_tasks=g["across_tasks"],
                accountant=g["accountant"],
                adjacency=g["adjacency"],
                unit=g["unit"],
                groups=_extended(previous_groups, kept, [GroupGuarantee.from_dict(x) for x in g["groups"]]),
                notes=(
                    self.releases[-1].guarantee.notes
                    if version >= 2 and g.get("notes") == "same" and self.releases
                    else tuple(str(n) for n in g.get("notes", ()))
                ),
            )
            record = ReleaseRecord(int(r["task_index"]), int(r["n_charges"]), guarantee, r.get("checkpoint_sha256"))
            previous = self.releases[-1].n_charges if self.releases else 1
            if not previous <= record.n_charges <= len(self.charges):
                raise LedgerCorruptError(
                    f"{where}: release {len(self.releases)} covers {record.n_charges} charges; releases must "
                    f"cover a non-decreasing number of charges between 1 and the {len(self.charges)} recorded."
                )
            stated = (guarantee.delta, guarantee.across_tasks, guarantee.adjacency, guarantee.unit)
            expected = (self.delta, self.across_tasks, self.adjacency.value, self.unit)
            if stated != expected:
                raise LedgerCorruptError(
                    f"{where}: release {len(self.releases)} states (delta, across_tasks, adjacency, unit) = "
                    f"{stated} but the ledger's settings are {expected}."
                )
            self.releases.append(record)

    @classmethod
    def load(cls, path: "str | os.PathLike[str]") -> "TaskLedger":
        """Load a saved ledger and the lines of its journal (:meth:`save`); a missing file raises
        FileNotFoundError, a damaged ledger or journal LedgerCorruptError."""
        p = Path(path)
        with collector_paused():
            try:
                size = p.stat().st_size
                data = read_json(p)
            except FileNotFoundError:
                raise
            except (ValueError, UnicodeDecodeError) as exc:
                raise LedgerCorruptError(
                    f"ledger {str(p)!r} is truncated or not valid JSON ({exc}); it is never replaced automatically: "
                    "restore it from a backup or move it away deliberately."
                ) from exc
            ledger = cls.from_dict(data, path=p)
            ledger._replay_journal(data["sha256"], size)
        return ledger

    @classmethod
    def open(cls, path: "str | os.PathLike[str]", *, must_exist: bool = False, **settings: Any) -> "TaskLedger":
        """Resume the ledger at ``path`` if it exists (its settings must match), else create it there.

        A resumed ledger keeps every charge and release already recorded. A caller resuming a run that
        has already released something passes ``must_exist=True``: a missing ledger then raises
        :class:`~dpcl.errors.LedgerCorruptError` instead of starting an empty one, which would drop the
        budget already spent and understate every later guarantee.
        """
        p = Path(path)
        if must_exist and not p.exists():
            raise LedgerCorruptError(
                f"ledger {str(p)!r} is missing but the run being resumed has already released checkpoints: "
                "starting a new ledger would forget the budget they spent. Restore the ledger from a backup, "
                "or start the run over in a new directory."
            )
        if p.exists():
            ledger = cls.load(p)
            fresh = cls(**settings)
            mismatched = {
                k: (ledger.settings()[k], v) for k, v in fresh.settings().items() if ledger.settings()[k] != v
            }
            if mismatched:
                desc = "; ".join(f"{k}: ledger has {a!r}, run asks {b!r}" for k, (a, b) in mismatched.items())
                raise ConfigError(
                    f"ledger {str(p)!r} was written with different privacy settings ({desc}). "
                    "Resume with the original settings or start a new ledger file."
                )
            if settings.get("metadata"):
                ledger.metadata.update(settings["metadata"])
            if ledger._persisted["lines"] or ledger.torn_journal_bytes:
                ledger.compact()  # a resumed run starts from one file again
            return ledger
        ledger = cls(path=p, **settings)
        ledger.save()
        return ledger
