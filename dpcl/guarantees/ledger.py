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

The parts live in their own modules: charges and their compact form in :mod:`dpcl.guarantees.charges`,
the guarantee records in :mod:`dpcl.guarantees.stream_guarantee`, composition across tasks in
:mod:`dpcl.guarantees.stream_composition`, the file and its journal in :mod:`dpcl.guarantees.ledger_store`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from dpcl.accounting.events import Adjacency, ComposedEvent, PrivacyEvent
from dpcl.accounting.filter import PrivacyFilter
from dpcl.accounting.validation import check_delta, check_positive
from dpcl.errors import DisjointnessViolationError, InvalidParameterError
# the ledger's parts, one concept each; their names are re-exported here, where they have always been imported
from dpcl.guarantees.charges import (
    MAX_CHARGES,
    Charge,
    ChargeRuns,
    charge_runs,
    charges_from_list,
    charges_to_list,
    check_indices,
    compact_indices,
    compress_events,
    distinct_charges,
    expand_indices,
    indices_equal,
)
from dpcl.guarantees.ledger_store import (
    COMPACT_LEDGER_ENTRIES,
    JOURNAL_MIN_BYTES,
    LEDGER_FORMAT,
    LEDGER_VERSION,
    READABLE_LEDGER_VERSIONS,
    LedgerPersistence,
    _canonical,
    journal_path,
)
from dpcl.guarantees import stream_composition
from dpcl.guarantees.stream_composition import (
    ACROSS_TASKS,
    _composition_groups,
    _group_epsilon,
    _group_events,
    _groups_with_runs,
    compose_stream,
    event_is_gaussian_type,
)
from dpcl.guarantees.stream_guarantee import GroupGuarantee, GroupsPrefix, ReleaseRecord, StreamGuarantee

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

def _unit_keys(unit_ids: Any) -> np.ndarray:
    array = np.asarray(unit_ids)
    if array.ndim != 1:
        raise InvalidParameterError(f"unit_ids must be a 1-D sequence of unit ids, got shape {array.shape}.")
    return array.astype(str)


class TaskLedger(LedgerPersistence):
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
        return float(stream_composition._compute(list(events), self.delta, self.accountant).epsilon)

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

